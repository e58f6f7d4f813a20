"""dev/sglang_gpu/cost_bench.py's summaries (pure logic, no SGLang): rounds cut per measured batch with the
warm-up skip applied to each repeat, tok/s medians over repeats, the tokens-equal check and the policy table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "dev" / "sglang_gpu" / "cost_bench.py"


def _load() -> ModuleType:
    name = "ddtree_cost_bench_script"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


cb = _load()


def _round(bs: int, t: float, verify: float) -> dict[str, Any]:
    return {"bs": bs, "host_start": t, "host_end": t + 0.001, "host_exit": t + 0.002, "verify_ms": verify,
            "round_ms": verify + 1, "tokens": bs}  # fmt: skip


def test_summarize_skips_the_first_rounds_of_every_repeat(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = []
    for repeat in range(2):
        lines.append({"marker": "measure 4"})
        # per repeat: 2 slow start-up rounds (skipped), then 3 steady ones
        lines += [_round(4, 10.0 * repeat + i * 0.01, 99.0 if i < 2 else 5.0) for i in range(5)]
        lines.append({"marker": "done 4"})
    timer = tmp_path / "rounds.jsonl"
    timer.write_text("\n".join(json.dumps(x) for x in lines))
    row = cb.summarize(timer, [4], skip=2)["4"]
    assert row["rounds"] == 6 and row["verify_ms"] == 5.0
    assert row["step_ms"] == pytest.approx(10.0)  # no step across the gap between the two repeats


def _entry(walls: list[float], digest: str = "d") -> dict[str, Any]:
    batches = [{"bs": 8, "repeat": r, "wall_s": w, "out_lens": [100] * 8, "output_ids_sha256": digest}
               for r, w in enumerate(walls)]  # fmt: skip
    return {"result": {"batches": batches}}


def test_tok_s_is_the_median_over_repeats() -> None:
    assert cb.decode_tok_s(_entry([1.0, 4.0, 2.0])) == {"8": pytest.approx(400.0)}


def test_same_tokens_and_the_policy_table() -> None:
    runs = {"dense-dflash-graph": _entry([2.0, 2.0, 2.0]), "dense-tree-graph": _entry([2.5, 2.5, 2.5]),
            "dense-tree-chain-graph": _entry([2.1, 2.1, 2.1]),
            "dense-tree-policy-graph": {**_entry([2.05, 2.2, 2.0]), "policy_choice": "5-8:chain"}}  # fmt: skip
    assert cb.same_tokens(runs, list(runs)) is True
    table = cb.policy_table([{"runs": runs}])
    row = next(line for line in table.splitlines() if line.startswith("| dense | graph | 8 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[3:] == ["400.0", "320.0", "381.0", "390.2", "0.976", "5-8:chain"]
    assert "tokens equal across dflash, tree, tree-chain, tree-policy: True" in table
    runs["dense-tree-graph"] = _entry([2.5, 2.5, 2.5], digest="other")
    assert cb.same_tokens(runs, list(runs)) is False


def test_the_replay_table_puts_trees_against_dflash_at_the_pairs_tau() -> None:
    """The replay table: DFLASH's step at the pair's tau (projected), each tree<N> at its replayed tokens per
    request-round over its own step, the baseline from wall time."""

    def run(rounds: dict[str, dict[str, float]], batches: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"result": {"batches": batches or []}, "rounds": rounds}

    report = {
        "runs": {
            "hybrid-baseline-graph": run({}, [{"bs": 8, "out_lens": [100] * 8, "wall_s": 2.0}]),
            "hybrid-dflash-graph": run({"8": {"step_ms": 40.0, "tau": 1.0}}),
            "hybrid-tree15-graph": run({"8": {"step_ms": 41.0, "tau": 2.88}}),
            "hybrid-tree7-graph": run({"8": {"step_ms": 40.5, "tau": 2.49}}),
        }
    }
    lines = cb.replay_table([report], dflash_tau=2.11).splitlines()
    rows = {ln.split(" | ")[2]: ln.split(" | ") for ln in lines[2:]}
    assert rows["baseline"][5:7] == ["50.0", "400.0"]
    assert rows["DFLASH (tau 2.11, projected)"][5] == "52.8" and rows["DFLASH (tau 2.11, projected)"][7] == "1.00 |"
    assert rows["tree15 (replayed)"][5] == "70.2" and rows["tree15 (replayed)"][7] == "1.332 |"
    assert [ln.split(" | ")[2] for ln in lines[2:]][2:] == ["tree7 (replayed)", "tree15 (replayed)"]
    assert cb.mode_of("hybrid-tree15-graph") == "tree15"


def test_baseline_and_sized_tree_modes_with_the_replay(tmp_path: Path) -> None:
    args = cb.argparse.Namespace(
        batches=[1, 8], prefix=64, new_tokens=32, mem_fraction_hybrid=0.8, mem_fraction_dense=0.5, budget=15, topk=8,
        loop_profile=False, old_runtime=None, replay=tmp_path / "paths.json", replay_dflash=None,
    )  # fmt: skip
    base = cb.engine_kwargs(tmp_path, "hybrid", "baseline", True, args)
    assert "speculative_algorithm" not in base and "speculative_draft_model_path" not in base
    env = cb.run_env("hybrid", "tree31", args, tmp_path / "t.jsonl")
    assert env["DDTREE_BUDGET"] == "31" and env["DDTREE_REPLAY_ACCEPTANCE"] == str(tmp_path / "paths.json")
    assert "DDTREE_REPLAY_ACCEPTANCE" not in cb.run_env("hybrid", "dflash", args, tmp_path / "t.jsonl")
    assert "DDTREE_DFLASH_REPLAY" not in cb.run_env("hybrid", "dflash", args, tmp_path / "t.jsonl")
    args.replay_dflash = tmp_path / "accepts.json"  # the fair replay: DFLASH's own recorded lengths
    assert cb.run_env("hybrid", "dflash", args, tmp_path / "t.jsonl")["DDTREE_DFLASH_REPLAY"] == str(
        (tmp_path / "accepts.json").resolve()
    )
