from pathlib import Path

import pytest

from opsctl import metrics
from opsctl.metrics import DDTreeInit, DDTreeMetrics, DDTreeVerify, DecodeBatch, Malformed

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"


def _records(name):
    return metrics.parse_lines((LOGS / name).read_text().splitlines())


def test_ddtree_contract_lines():
    recs = _records("ddtree_contract.log")
    init, verify, m1, decode, m2 = recs
    assert init == DDTreeInit("tree", 32, 8, 16, "exact", {"target": "/dev/shm/target"})
    assert verify == DDTreeVerify(3, 33)
    assert isinstance(m1, DDTreeMetrics) and m1.rounds == 50 and m1.tokens == 161 and m1.tau == 3.22
    assert (m1.nodes, m1.depth, m1.off_spine, m1.tok_s) == (32.0, 6.4, 0.18, 118.5)
    assert not m1.hybrid_unsafe
    assert isinstance(m2, DDTreeMetrics) and m2.hybrid_unsafe and m2.extra == {"new_key": "7"}
    assert isinstance(decode, DecodeBatch) and decode.accept_len == 3.22 and decode.graph is False


def test_sglang_dense_decode_lines():
    recs = _records("sglang_decode_dense.log")
    assert len(recs) == 3  # Prefill and access-log lines are not records
    first, second, old_style = recs
    assert first == DecodeBatch(1, 90, 0.0, 124.2, 0, 3.21, 0.44, None, True, False, {})
    assert second.running_req == 2 and second.queue_req == 1 and second.gen_throughput == 100.1
    assert old_style.accept_len is None and old_style.tokens == 77 and old_style.gen_throughput == 41.05


def test_sglang_hybrid_decode_lines():
    recs = _records("sglang_decode_hybrid.log")
    assert len(recs) == 2
    plain, spec = recs
    assert plain.hybrid and plain.tokens == 1051 and plain.token_usage == 0.2 and plain.mamba_usage == 0.2
    assert plain.extra == {"mamba num": "16"} and plain.accept_len is None
    assert spec.hybrid and spec.accept_len == 4.12 and spec.accept_rate == 0.26 and spec.gen_throughput == 174.1


def test_malformed_lines_become_records_not_exceptions():
    recs = _records("malformed.log")
    assert all(isinstance(r, Malformed) for r in recs)
    reasons = [r.reason for r in recs]
    assert "invalid literal" in reasons[0]
    assert "without #running-req" in reasons[1]
    assert "invalid literal" in reasons[2]
    assert "without" in reasons[3] and "tau" in reasons[3]
    assert "without topk" in reasons[4]
    assert "unknown DDTREE line kind" in reasons[5]
    assert len(recs) == 6  # the bare "DDTREE" line carries no record


@pytest.mark.parametrize(
    "line",
    ["", "hello world", "INFO: 127.0.0.1 - GET /health 200", "Prefill batch, #new-seq: 1, #new-token: 3"],
)
def test_unrelated_lines(line):
    assert metrics.parse_line(line) is None


def test_summarize():
    recs = _records("sglang_decode_dense.log") + _records("ddtree_contract.log")
    s = metrics.summarize(recs)
    assert s.init is not None and s.init.mode == "tree"
    assert s.first_verify == DDTreeVerify(3, 33)
    assert s.last_metrics is not None and s.last_metrics.tau == 3.36
    assert s.metrics_lines == 2 and s.decode_lines == 4 and s.malformed == 0
    assert s.mean_accept_len == pytest.approx((3.21 + 2.79 + 3.22) / 3)
    assert s.hybrid_unsafe


def test_summarize_resets_on_restart():
    recs = [*_records("ddtree_contract.log")[:3], DDTreeInit("shadow", 16, 4, 16, "none")]
    s = metrics.summarize(recs)
    assert s.init.mode == "shadow" and s.last_metrics is None and s.first_verify is None


def test_recorded_reference_server_lines():
    recs = _records("reference_baseline_recorded.log")
    assert len(recs) == 6 and all(isinstance(r, DecodeBatch) for r in recs)
    assert [r.tokens for r in recs] == [71, 76, 81, 86, 91, 96]
    assert recs[0].graph is False and recs[0].accept_len is None and recs[-1].gen_throughput == 24.78


def test_policy_keys_parse_from_recorded_lines_and_old_lines_have_none():
    recs = _records("ddtree_policy.log")
    kinds = [type(r).__name__ for r in recs]
    assert kinds == [
        *("DDTreeInit", "DDTreeVerify", "DDTreeMetrics", "DDTreeMetrics"),
        *("DDTreeVerify", "DDTreeMetrics", "DDTreeMetrics", "Malformed"),
    ]
    first = recs[2]
    assert isinstance(first, DDTreeMetrics) and first.policy is not None
    assert first.policy.mode == "auto" and first.policy.shape == "tree12"
    assert first.policy.choice == (metrics.PolicyBucket(1, 1, "tree12"),)
    assert first.policy.estimates == {"tree12": 0.016, "tree6": None, "tree3": None, "chain": 0.104}
    assert (first.policy.switches, first.policy.probes) == (0, 1)
    assert (
        first.extra == {"width": "3.700"} and first.tau == 4.7 and first.tok_s == 76.609
    )  # the old keys read as before
    wide = recs[5]
    assert isinstance(wide, DDTreeMetrics) and wide.policy is not None
    assert wide.policy.describe() == "auto: tree32 at batch 1, tree16 at batch 5-8, chain at batch 17-32"
    bad = recs[7]
    assert isinstance(bad, Malformed) and "bad policy choice '5-:bush'" in bad.reason
    old = _records("ddtree_contract.log")[2]
    assert isinstance(old, DDTreeMetrics) and old.policy is None


@pytest.mark.parametrize(
    ("choice", "described"),
    [
        ("1-1:chain,2-2:chain,3-4:chain", "auto: chain at batch 1-4"),
        ("1-1:tree8,5-8:tree8", "auto: tree8 at batch 1, tree8 at batch 5-8"),  # a gap: not merged
        ("17-32:tree8,257-:chain", "auto: tree8 at batch 17-32, chain at batch >= 257"),
        ("-", "auto: tree8"),
    ],
)
def test_policy_describe_merges_adjacent_buckets(choice, described):
    line = (
        "DDTREE metrics rounds=1 tokens=2 tau=2.000 nodes=1.000 depth=1.000 off_spine=0.000 draft_ms=1.000 "
        "build_ms=1.000 verify_ms=1.000 commit_ms=1.000 tok_s=1.000 width=1.000 "
        f"policy=auto shape=tree8 choice={choice} est=- switches=0 probes=0"
    )
    rec = metrics.parse_line(line)
    assert isinstance(rec, DDTreeMetrics) and rec.policy is not None
    assert rec.policy.describe() == described


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("policy=auto shape=tree8", "policy keys without choice, est, switches, probes"),
        ("policy=auto shape=tree8 choice=0-1:tree8 est=- switches=0 probes=0", "bad policy choice"),
        ("policy=auto shape=tree8 choice=- est=tree8 switches=0 probes=0", "bad policy estimate"),
        ("policy=auto shape=tree8 choice=- est=tree8:x switches=0 probes=0", "could not convert"),
        ("policy=auto shape=tree8 choice=- est=- switches=1.5 probes=0", "invalid literal"),
    ],
)
def test_broken_policy_keys_make_the_line_malformed(tail, reason):
    line = (
        "DDTREE metrics rounds=1 tokens=2 tau=2.000 nodes=1.000 depth=1.000 off_spine=0.000 draft_ms=1.000 "
        f"build_ms=1.000 verify_ms=1.000 commit_ms=1.000 tok_s=1.000 {tail}"
    )
    rec = metrics.parse_line(line)
    assert isinstance(rec, Malformed) and reason in rec.reason
