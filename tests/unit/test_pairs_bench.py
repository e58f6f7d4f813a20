"""dev/sglang_gpu/pairs_bench.py and pairs_report.py: the pure parts (service plan, log-window summary, greedy
first differences, the report's tables) on recorded-shape lines and a synthetic JSON; the GPU run is not here."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LEVEL_LOG = REPO / "tests/fixtures/logs/pairs_level.log"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "dev/sglang_gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench = _load("pairs_bench")
report = _load("pairs_report")


def _args(**kw: Any) -> argparse.Namespace:
    base = dict(temperatures="0,1", budgets=[15], policy_budgets=[15], rg_budgets=[15], rg_max_bs=32, rust_probe=0)
    return argparse.Namespace(**(base | kw))


def test_service_plan_is_nine_services_with_temperature_one_only_for_linear_tree_and_policy() -> None:
    plan = {s.name: s for s in bench.service_plan(["dense", "hybrid"], _args())}
    assert list(plan) == [
        "dense-base", "dense-linear", "dense-tree15", "dense-policy15", "dense-tree15rg32",
        "hybrid-base", "hybrid-linear", "hybrid-tree15", "hybrid-policy15",
    ]  # fmt: skip
    assert {n for n, s in plan.items() if 1.0 in s.temperatures} == {
        "dense-linear", "dense-tree15", "dense-policy15", "hybrid-linear", "hybrid-tree15", "hybrid-policy15",
    }  # fmt: skip
    assert all(s.temperatures[0] == 0.0 for s in plan.values())
    assert plan["dense-policy15"].policy == "auto" and plan["dense-tree15"].policy is None
    assert plan["dense-tree15rg32"].host_env == (("DDTREE_ROUND_GRAPHS_MAX_BS", "32"),)
    assert plan["dense-tree15rg32"].variant == "tree-rg32"
    probe = bench.service_plan(["dense"], _args(rust_probe=1))
    assert probe[-1].name == "dense-rustcore"


def test_inventory_renders_the_policy_key() -> None:
    specs = bench.service_plan(["dense"], _args())
    args = argparse.Namespace(port=31000, topk=8, radix_core="python", mem_fraction=0.85, max_total_tokens=131072,
                              concurrency=[1, 32], decode_log_interval=10)  # fmt: skip
    text = bench.inventory_yaml({"dense": {"shm_dir": "/dev/shm/pairs/x"}}, specs, args)
    assert "      dense-policy15:" in text
    assert "        ddtree: {budget: 15, topk: 8, policy: auto}" in text
    assert text.count("ddtree: {budget: 15, topk: 8}\n") == 2  # tree15 and tree15rg32
    assert "DDTREE_ROUND_GRAPHS_MAX_BS" not in text  # the loader refuses DDTREE_* in extra_env


def test_summarize_window_weights_ddtree_lines_by_rounds_and_reads_decode_batch_lines() -> None:
    s = bench.summarize_window(LEVEL_LOG.read_text(), rounds_before=100)
    dd = s["ddtree"]
    assert dd["lines"] == 2 and dd["rounds"] == 150  # windows of 50 and 100 rounds
    assert (dd["tau"], dd["draft_ms"], dd["verify_ms"], dd["build_ms"]) == (4.333, 1.667, 4.333, 0.5)
    assert dd["round_ms"] == 7.0 and dd["width"] == 2.0
    assert dd["policy"] == {"shape": "chain", "choice": "auto: chain at batch 9-16", "switches": 1}
    assert s["decode"] == {"lines": 2, "running_req": 14.0, "gen_tok_s": 3550.5, "accept_len": 4.5, "cuda_graph": 0.5}
    assert s["policy_switches"] == [
        "batch 9-16: tree15 -> chain (tok/ms tree15 3.100, tree7 3.150, tree3 -, chain 3.300)"
    ]
    assert len(s["notes"]) == 1 and "take DFLASH's chain verify" in s["notes"][0]
    assert s["malformed"] == 1  # `#running-req: one`; the cut fragment is no record at all


def test_summarize_window_without_rounds_before_weighs_the_first_line_as_the_others() -> None:
    dd = bench.summarize_window(LEVEL_LOG.read_text())["ddtree"]
    assert dd["tau"] == 4.5 and dd["rounds"] == 100


def test_summarize_window_of_a_slice_without_lines() -> None:
    s = bench.summarize_window('[2026-12-02 10:41:08] INFO:     127.0.0.1:51234 - "POST /generate HTTP/1.1" 200 OK\n')
    assert s["ddtree"] == {"lines": 0}
    assert s["decode"] == {"lines": 0, "running_req": None, "gen_tok_s": None, "accept_len": None, "cuda_graph": None}
    assert s["policy_switches"] == [] and s["malformed"] == 0
    assert bench.last_metrics_rounds(LEVEL_LOG.read_text()) == 250 and bench.last_metrics_rounds("") is None


# the baseline's top logprobs as SGLang's /generate returns them: [logprob, id, text] per candidate
REF_TOP = [
    [[-0.01, 10, "a"], [-4.0, 11, "b"]],
    [[-0.70, 20, "c"], [-0.73, 21, "d"]],
    [[-0.2, 30, "e"], [-2.0, 31, "f"]],
]


def test_first_difference_verdicts() -> None:
    ref = [10, 20, 30]
    assert bench.first_difference(ref, [10, 20, 30], REF_TOP, 0.5) == ("equal", None)
    assert bench.first_difference(ref, [10, 21, 30], REF_TOP, 0.5) == ("tie@1(0.030)", 1)
    assert bench.first_difference(ref, [10, 20, 31], REF_TOP, 0.5) == ("DIFF@2", 2)  # gap 1.8
    assert bench.first_difference(ref, [10, 20], REF_TOP, 0.5) == ("DIFF@2", None)  # a prefix: no position
    # an exact bf16 tie listed with the service's token first: still a near-tie (was read as DIFF)
    tied = [REF_TOP[0], [[-0.70, 21, "d"], [-0.70, 20, "c"]], REF_TOP[2]]
    assert bench.first_difference(ref, [10, 21, 30], tied, 0.5) == ("tie@1(0.000)", 1)
    assert bench.first_difference(ref, [10, 22, 30], tied, 0.5) == ("DIFF@1", 1)  # not in the baseline's top


def test_difference_record_keeps_both_top2() -> None:
    svc = [[-0.5, 31, "f"], [-0.9, 30, "e"]]
    rec = bench.difference_record(4, "DIFF@2", 2, [10, 20, 30], [10, 20, 31], REF_TOP, svc)
    assert rec == {
        "prompt": 4, "at": 2, "verdict": "DIFF", "base_token": 30, "svc_token": 31,
        "base_top2": REF_TOP[2], "base_gap": 1.8, "svc_top2": svc, "svc_gap": 0.4,
    }  # fmt: skip
    err = bench.difference_record(4, "DIFF@2", 2, [10, 20, 30], [10, 20, 31], REF_TOP, "HTTPStatusError: 400")
    assert err["svc_error"] == "HTTPStatusError: 400" and "svc_top2" not in err


def _level(c: int, tok_s: float, log: dict[str, Any] | None = None) -> dict[str, Any]:
    lv = {"concurrency": c, "tok_s_per_request": tok_s, "tok_s_per_gpu": tok_s * c, "ttft_s": 0.01, "itl_s": 0.002,
          "tau": 4.0}  # fmt: skip
    return lv | ({"log": log} if log else {})


def _entry(service: str, mode: str, variant: str | None, budget: int | None, levels: list[dict[str, Any]]) -> dict:
    e = {"service": service, "pair": "dense", "mode": mode, "temperature": 0.0, "budget": budget, "eager": False}
    return e | ({"variant": variant} if variant else {}) | {"levels": levels}


def synthetic() -> dict[str, Any]:
    log = bench.summarize_window(LEVEL_LOG.read_text(), rounds_before=100)
    lv = lambda t: [_level(1, t), _level(32, t / 4, log)]  # noqa: E731
    rec = bench.difference_record(
        4, "DIFF@2", 2, [10, 20, 30], [10, 20, 31], REF_TOP, [[-0.5, 31, "|"], [-0.9, 30, "e"]]
    )
    return {
        "levels": {
            "dense-linear@t0": _entry("dense-linear", "linear", "linear", None, lv(1000.0)),
            "dense-tree15@t0": _entry("dense-tree15", "tree", "tree", 15, lv(1200.0)),
            "dense-policy15@t0": _entry("dense-policy15", "tree", "tree-policy", 15, lv(1100.0)),
            "dense-tree15rg32@t0": _entry("dense-tree15rg32", "tree", "tree-rg32", 15, lv(900.0)),
        },
        "greedy": {
            "dense": {
                "dense-tree15": {
                    "equal": 31,
                    "ties": 0,
                    "diffs": 1,
                    "rows": ["equal"] * 4 + ["DIFF@2"],
                    "firsts": [rec],
                }
            }
        },
    }


def test_report_ratio_table_has_every_tree_variant() -> None:
    text = report.ratios(synthetic())
    assert "| dense | tree b15 | 1.20x | - | - | - | 1.20x |" in text
    assert "| dense | tree-policy b15 | 1.10x | - | - | - | 1.10x |" in text
    assert "| dense | tree b15 rg32 | 0.90x | - | - | - | 0.90x |" in text
    assert "linear (DFLASH) |" not in text


def test_report_diff_table_shows_both_gaps() -> None:
    text = report.diff_table(synthetic())
    row = "| dense-tree15 | 5 | 3 | DIFF | 30 'e' -0.200, 31 'f' -2.000 | 1.800 | 31 | "
    row += "31 '\\|' -0.500, 30 'e' -0.900 | 0.400 |"
    assert row in text.splitlines()


def test_report_diff_table_reads_the_old_rows() -> None:
    old = {"greedy": {"dense": {"dense-tree7": {"equal": 1, "ties": 1, "diffs": 1,
                                                "rows": ["equal", "tie@27(0.062)", "DIFF@14"]}}}}  # fmt: skip
    lines = report.diff_table(old).splitlines()
    assert "| dense-tree7 | 2 | 28 | tie | not recorded | 0.062 | - | not recorded | - |" in lines
    assert "| dense-tree7 | 3 | 15 | DIFF | not recorded | - | - | not recorded | - |" in lines


def test_report_phase_table_at_c32() -> None:
    lines = report.phase_table(synthetic()).splitlines()
    row = next(ln for ln in lines if ln.startswith("| dense-policy15 |"))
    assert row == ("| dense-policy15 | 0 | 32 | 2 | 4.33 | 1.67 | 0.50 | 4.33 | 0.50 | 7.00 | 2 | 14.0 | 3550 | 50% | "
                   "auto: chain at batch 9-16 (1 sw) |")  # fmt: skip
    assert len(lines) == 2 + 4  # header, rule, one c=32 row per service (no c=16 level here)


def test_report_reads_the_last_gpu_run() -> None:
    data = json.loads((REPO / "docs/results/h200-pairs-bench.json").read_text())
    # the recorded run of 2026-12-03 (docs/runtime-perf.md): a rerun on the GPU changes these rows here too
    assert "| dense | tree b15 | 1.03x | 1.17x | 0.67x | 0.76x | 0.94x |" in report.ratios(data)
    assert "| dense-tree15 | 0 | 16 | 18 " in report.phase_table(data)
    assert "| dense-tree15 | 25 | 2 | 5 |" in report.greedy_summary(data)
