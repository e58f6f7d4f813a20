"""The `ddtree_*` Prometheus series (ddtree.prom) hold the numbers of the DDTREE metrics lines over the same
rounds; under SGLang's multiprocess convention they reach the collector only on rank 0 with the directory set."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from ddtree.config import DDTreeConfig
from ddtree.metrics import MetricsLog, RoundStats
from ddtree.policy import CHAIN, BucketView, PolicyMode, PolicySetting, PolicySnapshot, Shape
from ddtree.prom import NODE_BUCKETS, DDTreeProm, RoundLabels, observe_counts
from ddtree.sglang import prom_glue
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from opsctl.metrics import DDTreeMetrics, parse_lines


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model_name": "m", **labels}.items())))]


def _random_rounds(n: int, seed: int) -> list[RoundStats]:
    rng = random.Random(seed)
    return [
        RoundStats(
            accepted_len=rng.randint(1, 16),
            nodes=rng.randint(1, 64),
            depth=rng.randint(1, 15),
            off_spine=rng.random() < 0.3,
            draft_ms=rng.uniform(0.1, 5.0),
            build_ms=rng.uniform(0.0, 1.0),
            verify_ms=rng.uniform(1.0, 20.0),
            commit_ms=rng.uniform(0.0, 1.0),
            width=rng.randint(1, 8),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_series_equal_the_metrics_lines_over_the_same_rounds(seed: int) -> None:
    registry = CollectorRegistry()
    interval = 7
    lines: list[str] = []
    log = MetricsLog(
        DDTreeConfig(log_interval=interval), 16, "none", logging.getLogger("test-prom"), prom=DDTreeProm(registry, "m")
    )
    before = _samples(registry)
    for stats in _random_rounds(interval * 3, seed):
        emitted = log.record(stats)
        lines += emitted
        if any(line.startswith("DDTREE metrics") for line in emitted):
            now = _samples(registry)
            (last,) = [r for r in parse_lines(emitted) if isinstance(r, DDTreeMetrics)]
            assert _value(now, "ddtree_rounds_total") == last.rounds
            assert _value(now, "ddtree_committed_tokens_total") == last.tokens

            def window(name: str, **labels: str) -> float:
                return _value(now, name, **labels) - _value(before, name, **labels)  # noqa: B023

            n = window("ddtree_accept_length_count")
            assert n == interval
            assert round(window("ddtree_accept_length_sum") / n, 3) == last.tau
            assert round(window("ddtree_tree_nodes_sum") / n, 3) == last.nodes
            assert round(window("ddtree_tree_depth_sum") / n, 3) == last.depth
            assert round(window("ddtree_tree_width_sum") / n, 3) == float(last.extra["width"])
            assert round(window("ddtree_off_spine_rounds_total") / n, 3) == last.off_spine
            ms = {
                p: window("ddtree_phase_seconds_total", phase=p) * 1000 / n
                for p in ("draft", "build", "verify", "commit")
            }
            assert round(ms["verify"], 3) == last.verify_ms and round(ms["draft"], 3) == last.draft_ms
            busy_s = sum(ms.values()) * n / 1000
            assert round(window("ddtree_committed_tokens_total") / busy_s, 3) == pytest.approx(last.tok_s, abs=0.002)
            before = now
    assert len([line for line in lines if line.startswith("DDTREE metrics")]) == 3
    # every series exists from the start, at 0: the decode-round kinds, the self-check gauge
    fresh_registry = CollectorRegistry()
    DDTreeProm(fresh_registry, "m")
    fresh = _samples(fresh_registry)
    assert _value(fresh, "ddtree_rounds_total") == 0
    assert _value(fresh, "ddtree_decode_rounds_total", kind="dflash", reason="selfcheck") == 0
    assert _value(fresh, "ddtree_selfcheck_failed") == 0


def test_window_updates_equal_one_observe_per_round() -> None:
    """`observe_counts` (one update per distinct value) leaves a histogram as `observe` per value would."""
    values = [1, 1, 2, 16, 17, 100, 600, 32, 32, 0]
    one, bulk = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", registry=one, buckets=NODE_BUCKETS)
    b = Histogram("h", "h", registry=bulk, buckets=NODE_BUCKETS)
    for v in values:
        a.observe(v)
    observe_counts(b, Counter(values))
    got, want = ({k: v for k, v in _samples(r).items() if k[0] != "h_created"} for r in (bulk, one))
    assert got == want and len(want) == len(NODE_BUCKETS) + 3  # the buckets, +Inf, count, sum

    class Plain:  # a histogram without prometheus_client's internals: one observe per value
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, v: float) -> None:
            self.seen.append(v)

    plain = Plain()
    observe_counts(plain, Counter(values))
    assert sorted(plain.seen) == sorted(values)


def test_policy_state_and_decode_round_kinds() -> None:
    registry = CollectorRegistry()
    prom = DDTreeProm(registry, "m")
    tree32 = Shape(32)

    def snap(switches: int, probes: int, current: Shape) -> PolicySnapshot:
        views = (
            BucketView(1, 1, tree32, {}, None, 10, 0),
            BucketView(17, 32, current, {}, None, 10, switches),
            BucketView(257, None, CHAIN, {}, None, 1, 0),
        )
        return PolicySnapshot(PolicySetting(PolicyMode.AUTO), views, views[1], switches, probes)

    prom.policy(snap(2, 115, CHAIN))
    prom.policy(snap(3, 120, Shape(16)))
    prom.policy(snap(3, 120, Shape(16)))  # the same snapshot again adds nothing
    whys = ["log-prob requests (the tree round returns no log-probs)", "sampling requests", "?"]
    for kind, why in [("tree", ""), ("tree", ""), ("chain", ""), *(("dflash", w) for w in whys)]:
        prom.decode_round(kind, why)
    prom.self_check_failed()
    s = _samples(registry)
    assert _value(s, "ddtree_policy_switches_total") == 3 and _value(s, "ddtree_policy_probes_total") == 120
    shapes = {b: _value(s, "ddtree_policy_shape_budget", bucket=b) for b in ("1-1", "17-32", "257-")}
    assert shapes == {"1-1": 32, "17-32": 16, "257-": 0}
    assert _value(s, "ddtree_decode_rounds_total", kind="tree", reason="") == 2
    assert _value(s, "ddtree_decode_rounds_total", kind="chain", reason="") == 1
    assert _value(s, "ddtree_decode_rounds_total", kind="dflash", reason="sampling") == 1
    assert _value(s, "ddtree_decode_rounds_total", kind="dflash", reason="other") == 1
    assert _value(s, "ddtree_decode_rounds_total", kind="dflash", reason="logprob") == 1
    assert _value(s, "ddtree_decode_rounds_total", kind="dflash", reason="grammar") == 0
    assert _value(s, "ddtree_decode_rounds_total", kind="dflash", reason="penalties") == 0
    assert _value(s, "ddtree_selfcheck_failed") == 1


def test_rounds_are_counted_with_the_labels_the_engine_gives_them() -> None:
    """An engine whose rounds are decode rounds (the reference server) labels each: a shadow service's are
    DFLASH's chain verify (`dflash`, `shadow`), never `tree`; a `tree` label counts only trees verified whole."""
    registry = CollectorRegistry()
    rounds = _random_rounds(7, 3)
    shadow: RoundLabels = ("dflash", "shadow")
    labels: dict[int, RoundLabels] = {id(r): shadow if i % 3 else ("chain", "") for i, r in enumerate(rounds)}
    prom = DDTreeProm(registry, "m", kind_of_round=lambda r: labels[id(r)])
    prom.observe_window(rounds)
    s = _samples(registry)
    assert _value(s, "ddtree_decode_rounds_total", kind="dflash", reason="shadow") == 4
    assert _value(s, "ddtree_decode_rounds_total", kind="chain", reason="") == 3
    assert _value(s, "ddtree_decode_rounds_total", kind="tree", reason="") == 0
    assert _value(s, "ddtree_rounds_total") == 7


def test_sglang_sink_only_with_the_multiprocess_directory() -> None:
    assert prom_glue.sglang_sink({}) is None
    assert prom_glue.sglang_sink({"PROMETHEUS_MULTIPROC_DIR": ""}) is None


SGLANG_PROCESS = textwrap.dedent(
    """
    import json, logging, sys, types
    # SGLang's runtime context as a scheduler process publishes it (the real one imports all of SGLang)
    ctx = types.ModuleType("sglang.srt.runtime_context")
    ctx.get_parallel = lambda: types.SimpleNamespace(tp_rank=int(sys.argv[1]))
    ctx.get_serving = lambda: types.SimpleNamespace(served_model_name="m")
    sys.modules.update({"sglang": types.ModuleType("sglang"), "sglang.srt": types.ModuleType("sglang.srt"),
                        "sglang.srt.runtime_context": ctx})
    from ddtree.config import DDTreeConfig
    from ddtree.metrics import MetricsLog, RoundStats
    from ddtree import prom
    from ddtree.sglang import prom_glue
    prom.install_default(prom_glue.sglang_sink)  # what the plugin's register() does in every SGLang process
    log = MetricsLog(DDTreeConfig(log_interval=2), 16, "none", logging.getLogger("x"))
    for n in (3, 5, 1):
        log.record(RoundStats(n, 32, 8, n > 3, 1.0, 0.5, 10.0, 0.5, 4))
    log.flush()  # the partial window, as at shutdown
    prom_glue.note_round(False, "", "", policy=False)
    prom_glue.note_round(True, "", "", policy=False)  # prefill: not a decode round
    prom_glue.note_round(False, "log-prob requests", "", policy=False)
    prom_glue.note_round(False, "", "self-check round 9: request 0 ...", policy=False)
    for prefill in (False, True, False):  # a shadow worker's forwards: two decode rounds and a prefill
        prom_glue.note_shadow_round(prefill)
    print(json.dumps([log.prom is prom.default_sink(), log.prom is not None]))
    """
)


def test_multiprocess_files_reach_sglangs_collector(tmp_path: Path) -> None:
    """Two TP ranks of a scheduler as SGLang runs them with --enable-metrics: only rank 0 writes ddtree_*
    values, and SGLang's collector (a MultiProcessCollector over the directory) reads them."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for rank in (0, 1):
        out = subprocess.run(
            [sys.executable, "-c", SGLANG_PROCESS, str(rank)], env=env, capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == [True, rank == 0], out.stderr
    collect = (
        "from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess\n"
        "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r); print(generate_latest(r).decode())"
    )
    text = subprocess.run([sys.executable, "-c", collect], env=env, capture_output=True, text=True, check=True).stdout
    s = {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }

    def v(name: str, **labels: str) -> float:
        return _value(s, name, **labels)

    assert v("ddtree_rounds_total") == 3 and v("ddtree_committed_tokens_total") == 9
    assert v("ddtree_off_spine_rounds_total") == 1 and v("ddtree_accept_length_count") == 3
    assert v("ddtree_phase_seconds_total", phase="verify") == pytest.approx(0.03)
    assert v("ddtree_decode_rounds_total", kind="tree", reason="") == 1
    assert v("ddtree_decode_rounds_total", kind="dflash", reason="logprob") == 1
    assert v("ddtree_decode_rounds_total", kind="dflash", reason="selfcheck") == 1
    assert v("ddtree_decode_rounds_total", kind="dflash", reason="shadow") == 2
    assert v("ddtree_selfcheck_failed") == 1
