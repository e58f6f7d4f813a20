"""dev/sglang_gpu/pairs_stats.py: the interleaved start schedule and the per-level verdict (median, range,
bootstrap interval, and 'wider than +-5%' instead of a number)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pairs_stats", REPO / "dev/sglang_gpu/pairs_stats.py")
assert _spec is not None and _spec.loader is not None
stats = importlib.util.module_from_spec(_spec)
sys.modules["pairs_stats"] = stats
_spec.loader.exec_module(stats)


def interleaved() -> ModuleType:
    """dev/sglang_gpu/pairs_interleaved.py (it imports pairs_bench and pairs_stats from beside itself)."""
    if "pairs_interleaved" not in sys.modules:
        spec = importlib.util.spec_from_file_location("pairs_interleaved", REPO / "dev/sglang_gpu/pairs_interleaved.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["pairs_interleaved"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["pairs_interleaved"]


def test_rounds_alternate_the_reference_first_and_last() -> None:
    assert stats.interleaved_rounds("linear", ["tree15", "tree7", "linear"], 3) == [
        ["linear", "tree15", "tree7"],
        ["tree7", "tree15", "linear"],
        ["linear", "tree15", "tree7"],
    ]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        stats.interleaved_rounds("linear", ["tree15"], 0)


def level(
    rng: random.Random, ratio: float, offset_sd: float, noise_sd: float, rounds: int = 3
) -> list[tuple[list[float], list[float]]]:
    """Per round: a server-start offset shared by both sides (it cancels within the round), request noise."""
    out = []
    for _ in range(rounds):
        base = 500 * rng.lognormvariate(0, offset_sd)
        ref = [base * rng.lognormvariate(0, noise_sd) for _ in range(16)]
        svc = [ratio * base * rng.lognormvariate(0, noise_sd) for _ in range(16)]
        out.append((svc, ref))
    return out


def test_a_start_offset_cancels_within_its_round_and_the_level_reads() -> None:
    rng = random.Random(1)
    v = stats.level_verdict(4, level(rng, 1.27, offset_sd=0.3, noise_sd=0.03), resamples=500)
    assert v.readable and v.median == pytest.approx(1.27, rel=0.03)
    assert v.interval[0] < v.median < v.interval[1] and v.half_width <= 0.05
    assert v.text.startswith(f"{v.median:.2f}x [") and "95% CI" in v.text and "3 rounds" in v.text


def test_a_noisy_level_says_so_instead_of_a_number() -> None:
    rng = random.Random(2)
    v = stats.level_verdict(16, level(rng, 1.0, offset_sd=0.3, noise_sd=0.4), resamples=500)
    assert not v.readable and v.half_width > 0.05
    assert v.text.startswith("wider than +-5% (+-") and "no number (ratios " in v.text
    # ratios taken across rounds instead (the service of one start against the reference of another) would
    # carry the start offsets: the within-round ratios above do not
    two = stats.level_verdict(1, level(rng, 1.1, 0.0, 0.01, rounds=2), resamples=200)
    assert not two.readable and two.text.startswith("2 round(s): fewer than 3, no number")


def test_the_bootstrap_is_seeded_and_its_interval_holds_the_ratios_median() -> None:
    rounds = [([110.0, 112.0, 108.0], [100.0, 101.0, 99.0])] * 3
    assert stats.bootstrap_ratio(rounds, 300, seed=5) == stats.bootstrap_ratio(rounds, 300, seed=5)
    lo, hi = stats.bootstrap_ratio(rounds, 300)
    assert lo <= 1.1 <= hi and hi - lo < 0.05
    with pytest.raises(ValueError, match="samples on both sides"):
        stats.ratio_of_medians([], [1.0])


def test_the_report_merges_calls_and_takes_ratios_within_rounds() -> None:
    """Three calls, one round each; each round's servers have their own offset (x1, x0.6, x1.3): the tree's
    ratio over linear stays 1.25 within every round, and the policy is judged against the best fixed service."""
    mod = interleaved()
    rng = random.Random(3)
    calls = []
    for rnd, offset in enumerate((1.0, 0.6, 1.3)):
        recs = []
        for svc, speed in (("hybrid-linear", 300.0), ("hybrid-tree15", 375.0), ("hybrid-policy15", 360.0)):
            samples = [round(speed * offset * rng.lognormvariate(0, 0.01), 2) for _ in range(16)]
            level = {"concurrency": 1, "samples_tok_s": samples}
            recs.append({"pair": "hybrid", "round": rnd, "service": svc, "levels": {"t0": [level]}})
        calls.append({"rounds": recs})
    lines = mod.verdicts(calls)
    rows = {(ln.split(" | ")[2], ln.split(" | ")[3]): ln.split(" | ")[5] for ln in lines[2:]}
    assert rows[("hybrid-tree15", "hybrid-linear")].startswith("1.25x [")
    assert rows[("hybrid-policy15", "best fixed")].startswith("0.96x [")
    assert mod.plan(mod.parse_args(["--pairs", "dense", "--only-round", "1"]))["dense"]["rounds"] == {
        1: ["dense-policy15", "dense-tree15", "dense-tree7", "dense-linear"]
    }


def test_recording_runs_become_one_level_per_concurrency(tmp_path: Path) -> None:
    mod = interleaved()
    args = mod.parse_args(["--pairs", "hybrid", "--record", str(tmp_path), "--concurrency", "1,4"])
    names = [s.name for s in mod.record_plan("hybrid", args)]
    assert names == ["hybrid-recpaths", "hybrid-rectree15", "hybrid-rectree7", "hybrid-rectree3", "hybrid-recchain"]

    def line(rid: int, bs: int, shape: str, tree: int) -> str:
        smaller = {"7": tree - 1, "3": tree - 2} if shape == "tree15" else {}
        return json.dumps({"round_id": rid, "batch_size": bs, "shape": shape, "tree_accepted": tree,
                           "spine_accepted": tree - 1, "smaller": smaller, "cost_ms": 5.0, "gap_ms": 1.0})  # fmt: skip

    (tmp_path / "hybrid-tree15.jsonl").write_text("\n".join([line(0, 1, "tree15", 4), line(1, 4, "tree15", 12)]))
    (tmp_path / "hybrid-chain.jsonl").write_text("\n".join([line(0, 1, "chain", 3), line(1, 4, "chain", 9)]))
    result = {
        "rounds": [
            {"pair": "hybrid", "service": "hybrid-rectree15", "levels": {"record_marks": [0, 1, 2]}},
            {"pair": "hybrid", "service": "hybrid-recchain", "levels": {"record_marks": [0, 1, 2]}},
        ]
    }
    [path] = mod.write_recordings(result, args)
    data = json.loads(path.read_text())
    assert data["shapes"] == ["tree15", "tree7", "tree3", "chain"]
    assert [lv["name"] for lv in data["levels"]] == ["hybrid c=1", "hybrid c=4"]
    assert data["levels"][1]["rounds"] == [[4, 0, 5.0, 1.0, 12, 11, 10, 11], [4, 3, 5.0, 1.0, None, None, None, 9]]
