"""Benchmark (not a test): DDTREE's SGLang round bookkeeping, the batched device path against today's
per-request host path and against the batched top-k floor, with a parity check on the device it runs on.

    python runtime/bench/round_bench.py --json OUT.json      # GPU: batch 1/4/16/48 x prefix 1024/8192
    python runtime/bench/round_bench.py --quick               # CPU smoke run: small vocabulary, batch 1/4

Per (batch, prefix), drafter log-probs [bs, B - 1, V] (a few boosted tokens over Gaussian noise, peaked like a
trained drafter's) on the device, and greedy-verify outputs whose walks follow random root-to-node paths (often
off the spine). Columns, milliseconds, medians over --repeat runs after warm-up, wall clock with the device
synchronized around each call:

- floor: one `torch.topk(k)` over the same [bs, B - 1, V] log-probs (eager; `floor g` replayed in a CUDA graph);
- old plan / old commit: `tree_worker.plan_round` (build_tree_heap + host layout + FULL_MASK per request, then
  the copies) and `commit_round` (a Python loop per request);
- plan / mask / commit: `batch_round.plan_batch`, `full_mask_batched`, `commit_batch`, eager;
- plan g / commit g: the same plan and commit captured in CUDA graphs and replayed (CUDA only; FULL_MASK's size
  depends on the prefix lengths, so `mask` stays eager in the graph total);
- new eager = plan + mask + commit, new graph = plan g + mask + commit g, and their ratio to the floor;
- fused: the same with `ddtree.fused_tree`'s Triton kernels (top-k, best-first expansion, layout, FULL_MASK:
  `plan f`, `mask f`, `plan fg` replayed); `fused eager` = plan f + mask f + commit, `fused graph` = plan fg +
  mask f + commit g (CUDA only; the other columns are the torch-only batched path, `DDTREE_FUSED_BUILD=0`).

Parity: every configuration compares the batched plan (tokens, positions, FULL_MASK, retrieve_* links) and
commit (committed tokens, lengths, bonus, permutation, off-spine) with plan_round / commit_round, the CUDA-graph
replay with eager, and a tie-heavy set (quantized, uniform, -inf, long tied runs) at a smaller vocabulary. Any
mismatch prints it and exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

if __package__ in (None, ""):  # run as a script from a checkout: this checkout's runtime package, no install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddtree.config import FusedBuild
from ddtree.fused_tree import fused_available
from ddtree.sglang.batch_round import (
    BatchCommit,
    BatchPlan,
    commit_batch,
    full_mask_batched,
    full_mask_numel,
    plan_batch,
)
from ddtree.sglang.devcheck import random_path_verify
from ddtree.sglang.tree_round import TreeCommit, TreeRound, commit_round, plan_round

COLUMNS = (
    ("bs", "bs"),
    ("prefix", "prefix"),
    ("floor_ms", "floor"),
    ("floor_graph_ms", "floor g"),
    ("old_plan_ms", "old plan"),
    ("old_commit_ms", "old commit"),
    ("plan_ms", "plan"),
    ("mask_ms", "mask"),
    ("commit_ms", "commit"),
    ("plan_graph_ms", "plan g"),
    ("commit_graph_ms", "commit g"),
    ("new_eager_ms", "new eager"),
    ("new_graph_ms", "new graph"),
    ("eager_vs_floor", "eager/floor"),
    ("graph_vs_floor", "graph/floor"),
    ("old_vs_new_eager", "old/new eager"),
    ("fused_plan_ms", "plan f"),
    ("fused_mask_ms", "mask f"),
    ("fused_plan_graph_ms", "plan fg"),
    ("fused_eager_ms", "fused eager"),
    ("fused_graph_ms", "fused graph"),
    ("fused_eager_vs_floor", "f eager/floor"),
    ("fused_graph_vs_floor", "f graph/floor"),
)


def planner(fused: bool) -> FusedBuild:
    """The planner setting a timed call passes (`DDTreeConfig.fused_build`): Triton's, or torch's."""
    return FusedBuild.ON if fused else FusedBuild.OFF


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], Any], device: torch.device, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def drafter_logprobs(bs: int, rows: int, vocab: int, device: torch.device, seed: int) -> Tensor:
    """[bs, rows, vocab] peaked log-probs: Gaussian noise plus 4 boosted tokens per row (top-1 p ~ 0.7)."""
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((bs, rows, vocab), generator=g, device=device)
    boosted = torch.randint(0, vocab, (bs, rows, 4), generator=g, device=device)
    boost = torch.tensor([11.0, 9.0, 8.0, 7.5], device=device).expand(bs, rows, 4).contiguous()
    logits.scatter_(2, boosted, boost)
    return torch.log_softmax(logits, dim=-1)


def tie_logprobs(kind: str, bs: int, rows: int, vocab: int, device: torch.device, seed: int) -> Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    if kind == "quantized":  # few distinct values, 0.0 included
        return -torch.randint(0, 4, (bs, rows, vocab), generator=g, device=device).float() * 0.25
    if kind == "uniform":
        return torch.full((bs, rows, vocab), -math.log(vocab), device=device)
    if kind == "neg_inf":
        lp = torch.log_softmax(torch.randn((bs, rows, vocab), generator=g, device=device) * 3, dim=-1)
        return lp.masked_fill(torch.rand((bs, rows, vocab), generator=g, device=device) < 0.6, float("-inf"))
    if kind == "long_ties":  # 3 winners per row, then a run of equal values the top-k cuts
        lp = torch.full((bs, rows, vocab), -9.0, device=device)
        lp.scatter_(2, torch.randint(0, vocab, (bs, rows, 3), generator=g, device=device), -0.5)
        return lp
    if kind == "bf16_logits":  # the worker's case: log_softmax of bf16 logits, many exact ties near the top
        logits = (torch.randn((bs, rows, vocab), generator=g, device=device) * 2).to(torch.bfloat16)
        return torch.log_softmax(logits.float(), dim=-1)
    raise ValueError(kind)


def plan_mismatches(ref: TreeRound, plan: BatchPlan, mask: Tensor) -> list[str]:
    pairs = {
        "tokens": (ref.tokens, plan.tokens),
        "positions": (ref.positions, plan.positions),
        "custom_mask": (ref.custom_mask, mask),
        "retrieve_index": (ref.retrieve_index, plan.retrieve_index),
        "retrieve_next_token": (ref.retrieve_next_token, plan.retrieve_next_token),
        "retrieve_next_sibling": (ref.retrieve_next_sibling, plan.retrieve_next_sibling),
        "tree_parents": (torch.stack([t.parents for t in ref.trees]), plan.trees.parents),
        "tree_scores": (torch.stack([t.scores for t in ref.trees]), plan.trees.scores),
    }
    return [name for name, (want, got) in pairs.items() if want.shape != got.shape or not torch.equal(want, got.cpu())]


def commit_mismatches(ref: TreeCommit, commit: BatchCommit) -> list[str]:
    pairs = {
        "out_tokens": (ref.out_tokens, commit.out_tokens),
        "commit_lens": (ref.commit_lens, commit.commit_lens),
        "bonus": (ref.bonus, commit.bonus),
        "perm": (ref.perm, commit.perm),
        "off_spine": (torch.tensor(ref.off_spine), commit.off_spine),
        "bad_path": (torch.zeros(len(ref.paths), dtype=torch.bool), commit.bad_path),
    }
    return [name for name, (want, got) in pairs.items() if not torch.equal(want, got.cpu())]


def capture(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture fn in a CUDA graph (after warm-up on a side stream); returns the graph and its static outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def run_config(args: argparse.Namespace, device: torch.device, bs: int, prefix: int, seed: int) -> dict[str, Any]:
    rows, slots, budget, topk = args.block - 1, args.block, args.budget, args.topk
    lp = drafter_logprobs(bs, rows, args.vocab, device, seed)
    roots = torch.randint(0, args.vocab, (bs,), device=device)
    g = torch.Generator().manual_seed(seed)
    prefixes_host = prefix + torch.randint(0, 64, (bs,), generator=g)  # around the nominal prefix
    prefixes = prefixes_host.to(device)
    numel = full_mask_numel(int(prefixes_host.sum()), bs, slots)
    roots_list, prefix_list = roots.tolist(), prefixes_host.tolist()

    def old_plan() -> TreeRound:
        return plan_round(lp, roots_list, prefix_list, slots, budget, topk)

    ref = old_plan()
    index, num, predict = random_path_verify(ref, args.vocab, seed)
    ref_commit = commit_round(ref, index, num, predict)
    index_d, num_d, predict_d = index.to(device), num.to(device), predict.to(device)

    def new_plan() -> BatchPlan:
        return plan_batch(lp, roots, prefixes, slots, budget, topk, FusedBuild.OFF)

    def new_mask(tree_mask: Tensor) -> Tensor:
        return full_mask_batched(tree_mask, prefixes, numel, FusedBuild.OFF)

    plan = new_plan()
    mask = new_mask(plan.tree_mask)
    commit = commit_batch(plan, index_d, num_d, predict_d)
    problems = [f"plan:{m}" for m in plan_mismatches(ref, plan, mask)]
    problems += [f"commit:{m}" for m in commit_mismatches(ref_commit, commit)]

    k = min(topk, args.vocab)
    row: dict[str, Any] = {"bs": bs, "prefix": prefix}
    row["floor_ms"] = median_ms(lambda: lp.topk(k, dim=-1), device, args.repeat)
    row["old_plan_ms"] = median_ms(old_plan, device, args.old_repeat, warmup=1)
    row["old_commit_ms"] = median_ms(lambda: commit_round(ref, index_d, num_d, predict_d), device, args.old_repeat)
    row["plan_ms"] = median_ms(new_plan, device, args.repeat)
    row["mask_ms"] = median_ms(lambda: new_mask(plan.tree_mask), device, args.repeat)
    row["commit_ms"] = median_ms(lambda: commit_batch(plan, index_d, num_d, predict_d), device, args.repeat)
    row["new_eager_ms"] = row["plan_ms"] + row["mask_ms"] + row["commit_ms"]
    if args.graphs:
        try:
            floor_graph, _ = capture(lambda: lp.topk(k, dim=-1))
            plan_graph, plan_static = capture(new_plan)
            commit_graph, commit_static = capture(lambda: commit_batch(plan_static, index_d, num_d, predict_d))
            plan_graph.replay()
            commit_graph.replay()
            sync(device)
            replayed = [
                ("tokens", plan.tokens, plan_static.tokens),
                ("tree_mask", plan.tree_mask, plan_static.tree_mask),
                ("retrieve_next_token", plan.retrieve_next_token, plan_static.retrieve_next_token),
                ("retrieve_next_sibling", plan.retrieve_next_sibling, plan_static.retrieve_next_sibling),
                ("positions", plan.positions, plan_static.positions),
                ("perm", commit.perm, commit_static.perm),
                ("out_tokens", commit.out_tokens, commit_static.out_tokens),
                ("bonus", commit.bonus, commit_static.bonus),
            ]
            problems += [f"graph:{name}" for name, a, b in replayed if not torch.equal(a, b)]
            row["floor_graph_ms"] = median_ms(floor_graph.replay, device, args.repeat)
            row["plan_graph_ms"] = median_ms(plan_graph.replay, device, args.repeat)
            row["commit_graph_ms"] = median_ms(commit_graph.replay, device, args.repeat)
            row["new_graph_ms"] = row["plan_graph_ms"] + row["mask_ms"] + row["commit_graph_ms"]
            row["graph_vs_floor"] = row["new_graph_ms"] / row["floor_ms"]
            del plan_graph, commit_graph, floor_graph
        except RuntimeError as exc:  # a capture failure is a result too; eager parity still decides the exit
            row["graph_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if fused_available(device, topk):
        problems += fused_arm(row, plan, mask, index_d, num_d, predict_d, lp, roots, prefixes, numel, args, device)
    row["eager_vs_floor"] = row["new_eager_ms"] / row["floor_ms"]
    row["old_vs_new_eager"] = (row["old_plan_ms"] + row["old_commit_ms"]) / row["new_eager_ms"]
    row["nodes"] = plan.num_nodes - 1
    row["mean_depth"] = float(plan.depth.float().mean())
    row["off_spine"] = int(commit.off_spine.sum())
    row["mean_tau"] = float(commit.commit_lens.float().mean())
    row["parity"] = problems
    return row


def fused_arm(
    row: dict[str, Any], plan: BatchPlan, mask: Tensor, index: Tensor, num: Tensor, predict: Tensor, lp: Tensor,
    roots: Tensor, prefixes: Tensor, numel: int, args: argparse.Namespace, device: torch.device,
) -> list[str]:  # fmt: skip
    """The fused (Triton) plan and FULL_MASK: parity with the torch-only batched path (itself checked against
    the per-request references), eager and replayed times."""
    slots, budget, topk = args.block, args.budget, args.topk

    def fplan() -> BatchPlan:
        return plan_batch(lp, roots, prefixes, slots, budget, topk, FusedBuild.ON)

    def fmask(tree_mask: Tensor) -> Tensor:
        return full_mask_batched(tree_mask, prefixes, numel, FusedBuild.ON)

    got = fplan()
    problems = [f"fused:{m}" for m in plan_pair_mismatches(plan, got)]
    if not torch.equal(fmask(got.tree_mask), mask):
        problems.append("fused:custom_mask")
    row["fused_plan_ms"] = median_ms(fplan, device, args.repeat)
    row["fused_mask_ms"] = median_ms(lambda: fmask(got.tree_mask), device, args.repeat)
    row["fused_eager_ms"] = row["fused_plan_ms"] + row["fused_mask_ms"] + row["commit_ms"]
    row["fused_eager_vs_floor"] = row["fused_eager_ms"] / row["floor_ms"]
    if "commit_graph_ms" in row:
        try:
            graph, static = capture(fplan)
            graph.replay()
            sync(device)
            problems += [f"fused graph:{m}" for m in plan_pair_mismatches(plan, static)]
            row["fused_plan_graph_ms"] = median_ms(graph.replay, device, args.repeat)
            row["fused_graph_ms"] = row["fused_plan_graph_ms"] + row["fused_mask_ms"] + row["commit_graph_ms"]
            row["fused_graph_vs_floor"] = row["fused_graph_ms"] / row["floor_ms"]
            del graph
        except RuntimeError as exc:
            row["fused_graph_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return problems


def plan_pair_mismatches(a: BatchPlan, b: BatchPlan) -> list[str]:
    """Fields of two BatchPlans that differ (the trees' included)."""
    bad = [f.name for f in fields(a) if f.name != "trees" and not same(getattr(a, f.name), getattr(b, f.name))]
    return bad + [f"trees.{n}" for n in ("tokens", "parents", "depths", "scores")
                  if not same(getattr(a.trees, n), getattr(b.trees, n))]  # fmt: skip


def same(x: Tensor, y: Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)


def tie_parity(args: argparse.Namespace, device: torch.device) -> list[str]:
    """Batched plan + commit vs the references on tie-heavy log-probs, on this device."""
    problems = []
    vocab = min(args.vocab, 3000)
    for i, kind in enumerate(("quantized", "uniform", "neg_inf", "long_ties", "bf16_logits")):
        for budget, slots in ((args.budget, args.block), (1, args.block), (2 * args.block - 1, 2 * args.block)):
            bs, rows = 6, args.block - 1
            lp = tie_logprobs(kind, bs, rows, vocab, device, seed=100 + i)
            roots = torch.arange(bs, device=device)
            prefixes_host = torch.arange(bs) * 7 + 3
            ref = plan_round(lp, roots.tolist(), prefixes_host.tolist(), slots, budget, args.topk)
            numel = full_mask_numel(int(prefixes_host.sum()), bs, slots)
            index, num, predict = random_path_verify(ref, vocab, seed=i)
            for fused in (False, True) if fused_available(device, args.topk) else (False,):
                plan = plan_batch(lp, roots, prefixes_host.to(device), slots, budget, args.topk, planner(fused))
                mask = full_mask_batched(plan.tree_mask, prefixes_host.to(device), numel, planner(fused))
                commit = commit_batch(plan, index.to(device), num.to(device), predict.to(device))
                bad = plan_mismatches(ref, plan, mask)
                bad += commit_mismatches(commit_round(ref, index, num, predict), commit)
                problems += [f"ties {kind} budget={budget} fused={fused}: {name}" for name in bad]
    return problems


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [(key, title) for key, title in COLUMNS if any(key in r for r in rows)]
    print("| " + " | ".join(title for _, title in cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for r in rows:
        cells = []
        for key, _ in cols:
            v = r.get(key, "")
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small sizes for a CPU smoke run")
    p.add_argument("--batches", default="1,4,16,48")
    p.add_argument("--prefixes", default="1024,8192")
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--budget", type=int, default=15)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--repeat", type=int, help="timed runs per arm (default 50; 5 with --quick)")
    p.add_argument("--old-repeat", type=int, help="timed runs of the per-request path (default 15; 3 with --quick)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="skip the CUDA-graph columns")
    p.add_argument("--json", type=Path, help="write the rows and the run's settings here")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.prefixes, args.vocab = "1,4", "64,256", 4096
    args.repeat = args.repeat or (5 if args.quick else 50)
    args.old_repeat = args.old_repeat or (3 if args.quick else 15)
    device = torch.device(args.device)
    args.graphs = args.graphs and device.type == "cuda" and torch.cuda.is_available()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    started = time.perf_counter()
    problems = tie_parity(args, device)
    rows = []
    for i, bs in enumerate(int(x) for x in args.batches.split(",")):
        for j, prefix in enumerate(int(x) for x in args.prefixes.split(",")):
            row = run_config(args, device, bs, prefix, seed=1000 * i + j)
            problems += [f"bs={bs} prefix={prefix}: {m}" for m in row["parity"]]
            rows.append(row)
            print(f"# bs={bs} prefix={prefix} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"# device {name}, torch {torch.__version__}, Python {platform.python_version()}, vocab {args.vocab}, "
        f"budget {args.budget}, top-k {args.topk}, block {args.block}, medians of {args.repeat} "
        f"(old path: {args.old_repeat}), milliseconds"
    )
    print_table(rows)
    verdict = "PASS" if not problems else "FAIL"
    print(f"# parity vs build_tree_heap / plan_round / commit_round on {device.type}: {verdict}")
    for problem in problems:
        print(f"#   mismatch: {problem}")
    for row in rows:
        if "graph_error" in row:
            print(f"# bs={row['bs']} prefix={row['prefix']}: CUDA graph capture failed: {row['graph_error']}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        report = {
            "device": name,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "settings": settings,
            "rows": rows,
            "parity": verdict,
            "mismatches": problems,
            "seconds": time.perf_counter() - started,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
