"""The fair replay's bookkeeping (dev/sglang_gpu/fair_replay.py: which recorded requests each batch size replays,
the recording's tau as SGLang will count it, per-request tok/s, the bootstrap interval of the ratio) and the GPU
stand-in's DFLASH replay (dev/sglang_gpu/standin/dflash_replay.py: a round's outputs forced to recorded lengths),
on plain values and CPU tensors."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
from dev_modules import load

pytestmark = pytest.mark.runtime

DEV = Path(__file__).resolve().parents[2] / "dev" / "sglang_gpu"


fr = load("ddtree_dev_fair_replay", DEV / "fair_replay.py")
dr = load("ddtree_dev_dflash_replay", DEV / "standin" / "dflash_replay.py")


@pytest.mark.parametrize("recorded", [1, 6, 16, 20])
def test_every_batch_size_replays_every_recorded_request_evenly(recorded: int) -> None:
    for bs in (1, 2, 3, 4, 8, 16, 32, 48):
        batches = fr.level_requests(bs, recorded)
        flat = [i for batch in batches for i in batch]
        assert all(len(batch) == bs for batch in batches)
        assert len(flat) >= max(recorded, 16) and len(flat) - bs < max(recorded, 16)  # whole batches, no more
        assert set(flat) == set(range(recorded))
        counts = [flat.count(i) for i in range(recorded)]
        assert max(counts) - min(counts) <= 1  # cycled: no request drawn twice before every other once
    with pytest.raises(ValueError, match="must be >= 1"):
        fr.level_requests(0, 4)


def simulate_sglang(lengths: list[int], new_tokens: int, cap: int) -> tuple[int, int]:
    """(completion tokens, verify rounds) of a request committing its recording, token by token: the prefill's
    token, then per round up to length + 1 tokens, none past new_tokens."""
    tokens, rounds, at = 1, 0, 0
    while tokens < new_tokens:
        commit = min(lengths[at % len(lengths)], cap) + 1
        tokens = min(tokens + commit, new_tokens)
        rounds, at = rounds + 1, at + 1
    return tokens, rounds


def test_the_recorded_tau_counts_as_sglang_does() -> None:
    assert fr.rounds_for([2, 0, 5], 10, 15) == [2, 0, 5]  # 1 + 3 + 1 + 6 = 11 >= 10
    assert fr.rounds_for([1], 6, 15) == [1, 1, 1]  # cycled
    assert fr.rounds_for([20], 40, 15) == [15, 15, 15]  # capped at the block's drafts
    assert fr.expected_accept_length([2, 0, 5], 10, 15) == pytest.approx(10 / 3)
    rng = random.Random(5)
    for _ in range(200):
        lengths = [rng.randrange(0, 20) for _ in range(rng.randrange(1, 9))]
        new, cap = rng.randrange(2, 300), rng.choice([3, 7, 15])
        tokens, rounds = simulate_sglang(lengths, new, cap)
        assert len(fr.rounds_for(lengths, new, cap)) == rounds
        assert fr.expected_accept_length(lengths, new, cap) == pytest.approx(tokens / rounds)
    assert fr.recording_tau([[0, 3], [15, 1]], 7) == pytest.approx((1 + 4 + 8 + 2) / 4)


def test_per_request_rates_and_their_means() -> None:
    assert fr.request_tok_s(129, 64, 30.0) == pytest.approx(128 / (64 * 0.030))
    assert fr.request_tok_s(129, 64, 30.0, replay_ms=5.0) == pytest.approx(128 / (64 * 0.025))
    assert fr.per_request([3, 1, 3], [1.0, 5.0, 2.0]) == {3: 1.5, 1: 5.0}


def test_the_bootstrap_pairs_requests_and_brackets_the_ratio() -> None:
    rng = random.Random(1)
    dflash = {i: rng.uniform(10, 40) for i in range(16)}
    # the tree exactly 1.25x DFLASH on every request: every resample gives 1.25 (an unpaired resample would not)
    ratio, low, high = fr.bootstrap_ratio({i: 1.25 * v for i, v in dflash.items()}, dflash)
    assert ratio == pytest.approx(1.25) and low == pytest.approx(1.25) and high == pytest.approx(1.25)
    # noisy per request: the interval has width and holds the point estimate
    tree = {i: v * rng.uniform(0.9, 1.6) for i, v in dflash.items()}
    ratio, low, high = fr.bootstrap_ratio(tree, dflash)
    assert ratio == pytest.approx(sum(tree.values()) / sum(dflash.values()))
    assert low < ratio < high and high - low > 0.02
    # requests one mode lacks are left out of both
    assert fr.bootstrap_ratio({0: 2.0, 1: 9.0}, {0: 1.0})[0] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no recorded request"):
        fr.bootstrap_ratio({0: 1.0}, {1: 1.0})


def test_a_report_row_sets_the_recording_beside_the_replay() -> None:
    recorded_d = [[1, 1, 1, 1], [3, 3]]  # tau 2 and 4 as recorded
    recorded_t = [[2, 2, 2], [5]]
    d = fr.ModeLevel([0, 1, 0, 1], [33, 33, 33, 33], [16, 8, 16, 8], [2.0, 4.0, 2.0, 4.0], 20.0, 0.0)
    t = fr.ModeLevel([0, 1, 0, 1], [33, 33, 33, 33], [11, 6, 11, 6], [3.0, 5.5, 3.0, 5.5], 22.0, 2.0)
    row = fr.report_row(2, d, t, (recorded_d, recorded_t), 33, (15, 15))
    assert row[:2] == ["2", "2"]
    want_d = (33 / len(fr.rounds_for([1], 33, 15)) + 33 / len(fr.rounds_for([3], 33, 15))) / 2
    assert row[2] == f"{want_d:.2f} / 3.00"
    assert row[4:7] == ["20.00", "22.00", "0.00 / 2.00"]
    d_rate = (32 / (16 * 0.020) + 32 / (8 * 0.020)) / 2
    t_rate = (32 / (11 * 0.020) + 32 / (6 * 0.020)) / 2  # 22 ms step less the replay's 2 ms
    assert row[7:9] == [f"{d_rate:.1f}", f"{t_rate:.1f}"]
    assert row[9].startswith(f"{t_rate / d_rate:.3f} [")
    assert fr.table([row]).count("\n") == 2


def test_dflash_rounds_are_forced_to_the_recorded_lengths_in_sglangs_layout() -> None:
    bs, block = 5, 6
    gen = torch.Generator().manual_seed(0)
    candidates = torch.randint(0, 100, (bs, block), generator=gen)
    predict = torch.randint(0, 100, (bs, block), generator=gen)
    lengths = torch.tensor([0, 5, 2, 3, 1])
    accept_len = torch.full((bs,), 9, dtype=torch.int32)
    commit_lens = torch.full((bs,), 9, dtype=torch.int32)
    bonus = torch.full((bs,), -1, dtype=torch.int64)
    out_tokens = torch.full((bs, block), -1, dtype=torch.int64)
    dr.force_accept(candidates, predict, lengths, accept_len, commit_lens, bonus, out_tokens)
    assert accept_len.tolist() == lengths.tolist() and commit_lens.tolist() == (lengths + 1).tolist()
    for b in range(bs):
        n = int(lengths[b])
        assert int(bonus[b]) == int(predict[b, n])  # the target's choice after the accepted drafts
        # SGLang's _commit_accept: drafts shifted left, the bonus at the accept boundary, 0 in the last column
        want = [*candidates[b, 1:].tolist(), 0]
        want[n] = int(predict[b, n])
        assert out_tokens[b].tolist() == want


def test_cost_bench_prints_the_fair_table_from_its_json_and_the_recordings(tmp_path: Path) -> None:
    import argparse
    import json

    cb = load("ddtree_dev_cost_bench", DEV / "cost_bench.py")
    accepts, paths = tmp_path / "accepts.json", tmp_path / "paths.json"
    accepts.write_text(json.dumps({"format": "ddtree-accepts/1", "requests": [[1, 1], [3]]}))
    paths.write_text(json.dumps({"format": "ddtree-paths/1", "requests": [[[0, 0]], [[0, 0, 1, 0]]]}))

    def run(verify: list[int], step: float, replay: float) -> dict[str, object]:
        batches = [{"bs": bs, "indices": ix, "out_lens": [17] * bs, "verify_ct": [verify[i] for i in ix],
                    "accept": [17 / verify[i] for i in ix]}
                   for bs in (1, 2) for ix in fr.level_requests(bs, 2, 4)]  # fmt: skip
        rounds = {str(bs): {"step_ms": step * bs, "replay_host_ms": replay} for bs in (1, 2)}
        return {"result": {"batches": batches}, "rounds": rounds}

    runs = {"hybrid-dflash-graph": run([8, 4], 10.0, 0.5), "hybrid-tree15-graph": run([6, 4], 11.0, 1.0)}
    report = {"args": {"new_tokens": "17", "temperature": "0.7"}, "runs": runs}
    args = argparse.Namespace(replay=paths, replay_dflash=accepts)
    text = cb.fair_table([report], args)
    assert "recordings: DFLASH tau 2.67, tree tau 4.00 over all their rounds (2 and 2 requests)" in text
    assert "hybrid: tree15 vs DFLASH, temperature 0.7" in text
    rows = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
    # bs 1: DFLASH recorded (17/8 + 17/4) / 2 beside the replayed mean of 17/8 and 17/4: equal
    d_tau = (17 / 8 + 17 / 4) / 2
    assert f"| {d_tau:.2f} / {d_tau:.2f} |" in rows[0]
    d_rate = (16 / (8 * 0.0095) + 16 / (4 * 0.0095)) / 2
    t_rate = (16 / (6 * 0.010) + 16 / (4 * 0.010)) / 2
    assert f"| {d_rate:.1f} | {t_rate:.1f} | {t_rate / d_rate:.3f} [" in rows[0]


# ---------------------------------------------------------------- R1 on SGLang's own DFLASH worker class

R1_SCRIPT = r"""
import json, sys
sys.path.append(sys.argv[1])  # after SGLang's own path: the stand-in's sgl_kernel must not shadow the CPU stub
import torch
import gpu_patches
from types import SimpleNamespace
from sglang.srt.speculative import dflash_worker_v2 as w
gpu_patches._patch_dflash_replay(w)

def worker(cls):
    # SGLang's class itself, without its __init__ (no model): what _accept_block reads on the greedy path
    out = object.__new__(cls)
    out._selector_sample, out._use_triton_accept_bonus, out.block_size = None, False, 4
    out._tp_sync = SimpleNamespace(sync=lambda *a, **k: None)
    return out

cand = torch.tensor([[5, 1, 2, 3], [5, 4, 6, 7], [5, 8, 9, 10]])
real = [0, 2, 3]  # the target's argmax follows each row's drafts this far
logits = torch.zeros(12, 16)
for b, n in enumerate(real):
    for j in range(4):
        logits[b * 4 + j, int(cand[b, j + 1]) if j < n else 11 + b + j % 2] = 1.0

def round_of(obj, rids):
    obj._ddtree_dev_rids = rids
    out = obj._accept_block(candidates=cand, next_token_logits=logits, sampling_info=None, draft_input=None,
                            prefix_lens=torch.zeros(3, dtype=torch.int64), bs=3, target_predict=None)
    return [t.tolist() if t is not None else None for t in out]

main = worker(w.DFlashWorkerV2)
rids = ["replay-1-a", "replay-0-b", "plain"]
rounds = [round_of(main, rids) for _ in range(8)]  # the recorder writes the file every round
Sub = type("Sub", (w.DFlashWorkerV2,), {})  # as DDTREE's tree worker: a subclass keeps SGLang's acceptance
print("R1 " + json.dumps({"applied": gpu_patches.APPLIED, "rounds": rounds, "sub": round_of(worker(Sub), rids),
                          "argmax": logits.argmax(-1).view(3, 4).tolist()}))
"""


def test_r1_records_the_real_lengths_and_replays_the_recorded_ones_on_sglangs_class(tmp_path: Path) -> None:
    import json
    import os
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sglang_cpu

    if reason := sglang_cpu.sglang_skip_reason():
        pytest.skip(reason)
    replay, record = tmp_path / "replay.json", tmp_path / "record.json"
    replay.write_text(json.dumps({"format": "ddtree-accepts/1", "requests": [[1, 3], [0, 2, 9]]}))
    env = {**os.environ, "DDTREE_DFLASH_REPLAY": str(replay), "DDTREE_DFLASH_RECORD": str(record)}
    proc = subprocess.run([sys.executable, "-c", sglang_cpu.PRELUDE + R1_SCRIPT, str(DEV / "standin")],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("R1 ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][3:])
    assert got["applied"] == ["R1"]
    argmax = got["argmax"]
    # recorded: SGLang's own greedy acceptance of every round (0, 2, 3 drafts), per request in first-seen order
    assert json.loads(record.read_text())["requests"] == [[0] * 8, [2] * 8, [3] * 8]
    # replayed: replay-1-* takes recorded request 1, replay-0-* request 0, "plain" the next in turn (0); capped at 3
    lengths = [round_[0] for round_ in got["rounds"]]
    recorded = [[0, 2, 9], [1, 3], [1, 3]]  # per live request: its recorded request's rounds
    assert lengths == [[min(recorded[b][r % len(recorded[b])], 3) for b in range(3)] for r in range(8)]
    for (_, commit, bonus, out, new_seq_lens), n in zip(got["rounds"], lengths, strict=True):
        assert commit == [x + 1 for x in n] and new_seq_lens is None
        assert bonus == [argmax[b][n[b]] for b in range(3)]
        assert [out[b][n[b]] for b in range(3)] == bonus
    # the subclass (DDTREE's worker) keeps SGLang's own acceptance
    assert got["sub"][0] == [0, 2, 3]


def test_cost_bench_fair_batches_replay_every_recorded_request_by_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cost_bench's Engine child in --fair mode, its Engine a recording stand-in (the GPU is not here): per batch
    size, batches of replay ids covering every recorded request, one timer segment per batch, and what the report
    reads (indices, output lengths, verify rounds, accept lengths) in its result."""
    import json
    import types

    from ddtree.sglang.replay import recorded_index

    cb = load("ddtree_dev_cost_bench", DEV / "cost_bench.py")
    calls: list[tuple[int, list[str] | None]] = []

    class Engine:
        def __init__(self, **kwargs: object) -> None:
            pass

        def generate(self, input_ids: list[list[int]], sampling_params: dict[str, int], rid: object = None) -> list:
            n = sampling_params["max_new_tokens"]
            calls.append((n, rid if isinstance(rid, list) else None))
            return [{"output_ids": [7] * n, "meta_info": {"spec_verify_ct": 3 + k, "spec_accept_length": n / (3 + k)}}
                    for k in range(len(input_ids))]  # fmt: skip

        def shutdown(self) -> None:
            pass

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    job = {"engine": {}, "batches": [1, 4], "prefix": 3, "vocab": 5000, "seed": 1, "timer": str(tmp_path / "t.jsonl"),
           "wait_s": 5, "repeats": 1, "sampling": {"temperature": 0.7, "max_new_tokens": 12, "ignore_eos": True},
           "fair": 6, "fair_minimum": 8}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "go").write_text("")
    cb.engine_child(tmp_path / "job.json", tmp_path / "result.json")
    result = json.loads((tmp_path / "result.json").read_text())
    measured = [rid for n, rid in calls if n == 12]
    assert all(rid is None for n, rid in calls if n == 8)  # warm-ups: no replay ids
    for bs in (1, 4):
        batches = [b for b in result["batches"] if b["bs"] == bs]
        want = fr.level_requests(bs, 6, 8)
        assert [b["indices"] for b in batches] == want
        assert [b["verify_ct"] for b in batches] == [[3 + k for k in range(bs)] for _ in want]
        assert all(b["out_lens"] == [12] * bs for b in batches)
        ids = [rids for rids in measured if rids is not None and len(rids) == bs]
        assert [[recorded_index(r) for r in rids] for rids in ids] == want
        assert len({r for rids in ids for r in rids}) == sum(map(len, want))  # every request id its own
    markers = [json.loads(x)["marker"] for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert markers.count("measure 1") == len(fr.level_requests(1, 6, 8)) == 8
    assert markers.count("measure 4") == markers.count("done 4") == 2
