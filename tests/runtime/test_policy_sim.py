"""ddtree.policy_sim: the recorded-rounds format, and the shape policy replayed over the committed fixture
(the CI check: within 3% of the best fixed shape at every level)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from ddtree.policy import CHAIN, PolicyConfig, PolicyMode, PolicySetting, Shape, ShapePolicy
from ddtree.policy_sim import (
    GOAL,
    CostSamples,
    Level,
    Recording,
    Round,
    RoundsFormatError,
    format_results,
    level_from_reports,
    load_recording,
    main,
    observed,
    parse_recording,
    recording_json,
    simulate,
    stable_policy,
)

pytestmark = pytest.mark.runtime

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "policy" / "rounds-synthetic.json.gz"
T15, T7, T3 = Shape(15), Shape(7), Shape(3)
SHAPES = (T15, T7, T3, CHAIN)


@pytest.fixture(scope="module")
def recording() -> Recording:
    return load_recording(FIXTURE)


def test_the_stable_policy_is_within_3_percent_of_the_best_fixed_shape_at_every_level(recording: Recording) -> None:
    results = simulate(recording, stable_policy(0))
    assert len(results) == 23
    below = [r.name for r in results if r.ratio < GOAL]
    assert not below, format_results(results, recording.shapes)
    # levels where the chain beats the configured tree are there, and the policy leaves the tree for it
    chain_best = [r for r in results if r.best == CHAIN]
    assert len(chain_best) >= 3 and max(r.share[CHAIN] for r in chain_best) > 0.75


def test_the_policy_before_issue_45_loses_on_the_same_rounds(recording: Recording) -> None:
    """The check can fail: the knobs that lost 9-54% on the pairs fall below the goal here too."""
    old = simulate(recording, lambda shapes: ShapePolicy(PolicyConfig(shapes=shapes), PolicySetting(PolicyMode.AUTO)))
    assert min(r.ratio for r in old) < 0.9


def test_without_start_up_costs_the_short_levels_lose(recording: Recording) -> None:
    """What docs/policy-rounds.md says: the worker must seed the costs; unseeded (costs borrowed from the nearest
    bucket, or probed), the pairs' short levels lose more than 3% somewhere."""
    bare = Recording(recording.shapes, tuple(dataclasses.replace(lv, startup={}) for lv in recording.levels))
    below = {r.name for seed in (0, 2) for r in simulate(bare, stable_policy(seed), seed=seed) if r.ratio < GOAL}
    assert below and all(name.startswith("pairs-") for name in below)


def _rec(rounds: list[Round], startup: dict[int, dict[int, tuple[float, float]]] | None = None) -> Recording:
    return Recording(SHAPES, (Level("l", "s", tuple(rounds), startup or {}),), "test")


def test_fixed_shapes_pay_their_mean_cost_and_tokens() -> None:
    rounds = [Round(2, 0, 10.0, 2.0, (8, 6, 4, 5)), Round(2, 0, 14.0, 2.0, (6, 6, 4, 5))]
    rounds += [Round(2, i, 6.0, 1.0, tuple(5 if j == i else None for j in range(4))) for i in (1, 2, 3)]
    [result] = simulate(_rec(rounds), stable_policy(0))
    assert result.rounds == 2  # the rows with every shape's acceptance
    assert result.fixed[T15] == pytest.approx(14 / 28)  # 14 tokens, 2 rounds x (12 + 2) ms mean
    assert result.fixed[T7] == pytest.approx(12 / 14) and result.fixed[CHAIN] == pytest.approx(10 / 14)
    assert result.best == T7 and 0 < result.ratio <= 1


def test_what_a_round_tells_the_policy_follows_the_counterfactual_rule() -> None:
    acc = (12, 10, 8, 9)
    assert observed(SHAPES, 0, acc, 2) == {T15: 6, T7: 5, T3: 4, CHAIN: 4.5}
    assert observed(SHAPES, 1, acc, 2) == {T7: 5, T3: 4, CHAIN: 4.5}
    assert observed(SHAPES, 3, acc, 2) == {CHAIN: 4.5}


def test_a_batch_size_without_samples_takes_the_nearest() -> None:
    costs = CostSamples([Round(4, 0, 8.0, None, (5, 5, 5, 5)), Round(16, 0, 20.0, 1.0, (5, 5, 5, 5))], 4)
    assert costs.mean(0, 4) == 8.0 and costs.mean(0, 5) == 8.0 and costs.mean(0, 12) == 21.0
    assert costs.mean(0, 32) == pytest.approx(42.0)  # beyond the largest: grows with the batch


def test_the_file_round_trips_and_bad_rows_name_their_place(tmp_path: Path) -> None:
    rec = _rec([Round(2, 0, 10.0, None, (8, 6, 4, 5))], {2: {0: (9.5, 0.2)}})
    data = recording_json(rec)
    assert parse_recording(json.loads(json.dumps(data))) == rec
    path = tmp_path / "r.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert load_recording(path) == rec
    bad = json.loads(json.dumps(data))
    bad["levels"][0]["rounds"][0][4] = 1  # fewer tokens than requests
    with pytest.raises(
        RoundsFormatError, match=r"levels\[0\]\.rounds\[0\]\[4\] \(accepted\): expected an integer >= 2"
    ):
        parse_recording(bad)
    bad["levels"][0]["rounds"][0] = [2, 0, 10.0]
    with pytest.raises(RoundsFormatError, match="expected \\[bs, ran, round_ms, gap_ms"):
        parse_recording(bad)
    with pytest.raises(RoundsFormatError, match="not a ddtree-rounds/1 file"):
        parse_recording({"format": "other"})


def test_recorded_reports_become_a_level(tmp_path: Path) -> None:
    lines = [
        {"round_id": 0, "batch_size": 2, "shape": "tree15", "tree_accepted": 9, "spine_accepted": 6,
         "smaller": {"7": 8, "3": 5}, "cost_ms": 10.0, "gap_ms": 1.5},
        {"round_id": 1, "batch_size": 2, "shape": "chain", "tree_accepted": 7, "spine_accepted": 7,
         "smaller": {}, "cost_ms": 8.0, "gap_ms": None},
        {"round_id": 2, "batch_size": 2, "shape": "tree15", "tree_accepted": 9, "cost_ms": None},
    ]  # fmt: skip
    level = level_from_reports("dense c=2", "dense", SHAPES, lines)
    assert level.rounds == (Round(2, 0, 10.0, 1.5, (9, 8, 5, 6)), Round(2, 3, 8.0, None, (None, None, None, 7)))
    records = tmp_path / "rounds.jsonl"
    records.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "out.json"
    args = ["record", str(records), "--out", str(out), "--level", "dense c=2", "--shapes", "tree15,tree7,tree3,chain"]
    assert main(args) == 0 and main(args) == 0  # the second adds the same rounds to the same level
    assert [len(lv.rounds) for lv in load_recording(out).levels] == [4]
    assert main(["run", str(out), "--strict"]) in (0, 1)
    assert main(["run", str(tmp_path / "missing.json")]) == 2
