"""Benchmark (not a test): per-round cost of tree build + compile + walk, heap reference vs vectorized.

    python runtime/bench/tree_bench.py --device cpu --repeat 20
    python runtime/bench/tree_bench.py --device cuda --repeat 50 --budgets 16,64,256,512

Inputs per round: draft log-probs [block - 1, vocab] (a few boosted tokens over Gaussian noise: top-1
p ~ 0.7, peaked like a trained drafter's), and target logits [N, vocab] whose argmax follows the tree for a few
levels and then misses (a walk of typical length). Each stage is timed on its own (CUDA synchronized), the
stages interleaved inside every repeat; medians over --repeat runs after warmup, in milliseconds; "round" =
build + compile + walk measured end to end. Builders: ref = build_tree_reference (plain per-row sort + heap),
vec = build_tree (vectorized per depth), heap = build_tree_heap (fast row_topk + heap). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from ddtree.tree import (
    DraftTree,
    build_tree,
    build_tree_heap,
    build_tree_reference,
    compile_tree,
    tree_shape,
    walk_tree,
)
from torch import Tensor

WALK_LEVELS = 4  # the synthetic target agrees with the tree for this many levels, then misses


@dataclass(frozen=True)
class Row:
    device: str
    budget: int
    nodes: int
    depth: int
    width: int
    accepted: int
    build_ref_ms: float
    build_vec_ms: float
    build_heap_ms: float
    compile_ms: float
    walk_ms: float
    round_ref_ms: float
    round_vec_ms: float
    round_heap_ms: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_interleaved(
    stages: dict[str, Callable[[], object]],
    device: torch.device,
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
    warmup: int = 2,
) -> dict[str, list[float]]:
    """Milliseconds per run of each stage. Stages alternate inside every repeat, so on a shared, noisy
    machine every stage sees the same background load."""
    for _ in range(warmup):
        for fn in stages.values():
            fn()
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(repeat):
        for name, fn in stages.items():
            start = clock()
            fn()
            _sync(device)
            times[name].append((clock() - start) * 1e3)
    return times


def _draft_logprobs(rows: int, vocab: int, device: torch.device, seed: int) -> Tensor:
    """[D, V] peaked like a trained drafter: a few boosted tokens per row over Gaussian noise, so the top
    token has p ~ 0.7 and the tree grows deep along likely paths rather than wide."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)  # [D, V]
    boost = torch.tensor([14.0, 12.0, 11.0, 10.5, 10.0, 9.5, 9.0, 8.5])[: min(8, vocab)]
    picks = torch.stack([torch.randperm(vocab, generator=g)[: boost.shape[0]] for _ in range(rows)])
    logits.scatter_(1, picks, boost.expand(rows, -1).contiguous())
    return logits.log_softmax(-1).to(device)


def _target_logits(tree: DraftTree, vocab: int, device: torch.device, seed: int) -> Tensor:
    """[N, V] logits whose argmax takes the second child (or the only one) for WALK_LEVELS levels."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tree.num_nodes, vocab, generator=g)  # [N, V]
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    node = 0
    for _ in range(WALK_LEVELS):
        children = [c for c in range(1, tree.num_nodes) if parents[c] == node]
        if not children:
            break
        node = children[1] if len(children) > 1 else children[0]
        logits[parents[node], tokens[node]] = 100.0
    return logits.to(device)


def bench_one(
    device: torch.device,
    budget: int,
    vocab: int,
    block: int,
    topk: int,
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Row:
    lp = _draft_logprobs(block - 1, vocab, device, seed=budget)
    tree = build_tree(lp, 0, budget, topk)
    logits = _target_logits(tree, vocab, device, seed=budget + 1)
    prefix_len = 1000
    shape = tree_shape(tree)
    accepted = len(walk_tree(tree, logits).accepted)

    def round_with(builder: Callable[[Tensor, int, int, int], DraftTree]) -> None:
        t = builder(lp, 0, budget, topk)
        compile_tree(t, prefix_len)
        walk_tree(t, logits)

    times = _time_interleaved(
        {
            "build_ref": lambda: build_tree_reference(lp, 0, budget, topk),
            "build_vec": lambda: build_tree(lp, 0, budget, topk),
            "build_heap": lambda: build_tree_heap(lp, 0, budget, topk),
            "compile": lambda: compile_tree(tree, prefix_len),
            "walk": lambda: walk_tree(tree, logits),
            "round_ref": lambda: round_with(build_tree_reference),
            "round_vec": lambda: round_with(build_tree),
            "round_heap": lambda: round_with(build_tree_heap),
        },
        device,
        repeat,
        clock,
    )
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return Row(
        device=str(device),
        budget=budget,
        nodes=shape.nodes,
        depth=shape.depth,
        width=shape.width,
        accepted=accepted,
        build_ref_ms=med["build_ref"],
        build_vec_ms=med["build_vec"],
        build_heap_ms=med["build_heap"],
        compile_ms=med["compile"],
        walk_ms=med["walk"],
        round_ref_ms=med["round_ref"],
        round_vec_ms=med["round_vec"],
        round_heap_ms=med["round_heap"],
    )


def markdown(rows: list[Row]) -> str:
    head = (
        "| device | budget | nodes | depth | width | tau | build ref | build vec | build heap | compile | walk "
        "| round ref | round vec | round heap | vec vs ref |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.device} | {r.budget} | {r.nodes} | {r.depth} | {r.width} | {r.accepted} "
            f"| {r.build_ref_ms:.2f} | {r.build_vec_ms:.2f} | {r.build_heap_ms:.2f} | {r.compile_ms:.2f} "
            f"| {r.walk_ms:.2f} | {r.round_ref_ms:.2f} | {r.round_vec_ms:.2f} | {r.round_heap_ms:.2f} "
            f"| {r.round_ref_ms / r.round_vec_ms:.1f}x |"
        )
    return "\n".join(lines)


def environment(device_names: list[str]) -> str:
    parts = [
        f"torch {torch.__version__}",
        f"python {platform.python_version()}",
        f"cpu threads {torch.get_num_threads()}",
        f"cpu {platform.processor() or platform.machine()}",
    ]
    if "cuda" in device_names:
        parts.append(f"gpu {torch.cuda.get_device_name(0)}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cpu, plus cuda when available)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per stage (median reported)")
    parser.add_argument("--budgets", default="16,64,256", help="comma-separated budgets")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen: 151936)")
    parser.add_argument("--block", type=int, default=16, help="drafter block size; tree depth cap = block - 1")
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: perf_counter (CUDA synchronized); cpu: this process's CPU time (steadier on a shared CPU "
        "box; meaningless for CUDA)",
    )
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    auto = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    devices = auto if args.device == "auto" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        print("CUDA requested but not available", file=sys.stderr)
        return 2
    budgets = [int(b) for b in args.budgets.split(",")]

    print(f"<!-- {' '.join(['python runtime/bench/tree_bench.py', *(argv or sys.argv[1:])])} -->")
    print(
        f"vocab {args.vocab}, block {args.block} (depth cap {args.block - 1}), topk {args.topk}, "
        f"median ms of {args.repeat}, {args.clock} clock; {environment(devices)}\n"
    )
    if args.clock == "cpu" and "cuda" in devices:
        print("--clock cpu measures host CPU time only; use wall for CUDA", file=sys.stderr)
        return 2
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = []
    for d in devices:
        for b in budgets:
            rows.append(bench_one(torch.device(d), b, args.vocab, args.block, args.topk, args.repeat, clock))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
