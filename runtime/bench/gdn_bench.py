"""Benchmark (not a test): the Gated DeltaNet recurrence of one tree verify, alone, at Qwen3.6-27B's GDN shape.

    python runtime/bench/gdn_bench.py --device cpu --threads 1 --clock cpu --repeat 7
    python runtime/bench/gdn_bench.py --device cuda --repeat 20

One GDN layer's delta-rule part for a DDTree tree of N nodes (48 value heads, d_k = d_v = 128, fp32 like the
runtime; projections, conv and norm are identical in every method and left out). Columns, medians of --repeat
runs interleaved in one process:

- `chunk`:  ddtree's exact tree method (ancestor-masked chunked form, one triangular solve)
- `depth`:  ddtree's exact depth-by-depth method (one recurrent step per depth from the parents' states)
- `flat`:   ddtree's chunked method on the flat chain 0..N-1 (what the `unsafe` path computes)
- `native`: transformers' own chunked kernel (torch fallback, chunk 64) over the N tokens in flat order: what a
  plain chain verify of N tokens costs in the same framework

and two checks per row: `chunk_vs_depth` (max relative difference of the two exact methods) and
`flat_vs_native` (ours on the flat chain against transformers' kernel: an independent check of the algebra).
Trees come from build_tree over synthetic drafter log-probs (`--draft flat`: shallow, wide; `sharp`: deep).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
from ddtree.hybrid import GDNMethod, GDNPlan, gdn_recurrence
from ddtree.tree import build_tree, compile_tree, tree_shape
from verify_bench import BOOSTS, TOPK, synthetic_logprobs  # this script's folder is on sys.path

HEADS, DK, DV = 48, 128, 128  # Qwen3.6-27B: 48 value heads (16 key heads repeated 3x), head dims 128
VOCAB = 32000  # only shapes the synthetic draft; the tree's shape depends on the boosts


def make_plan(n: int, draft: str, device: str, gen: torch.Generator) -> tuple[GDNPlan, GDNPlan, GDNPlan, dict]:
    tree = build_tree(synthetic_logprobs(VOCAB, "cpu", gen, draft), root_token=0, budget=n - 1, topk=TOPK)
    inputs = compile_tree(tree, 0)
    parents = inputs.parents.to(device)
    groups = [g.to(device) for g in inputs.depth_groups]
    plans = tuple(
        GDNPlan.build(parents, groups, conv_kernel=4, flat=flat, method=method)
        for flat, method in ((False, GDNMethod.CHUNK), (False, GDNMethod.DEPTH), (True, GDNMethod.CHUNK))
    )
    shape = tree_shape(tree)
    return (*plans, {"nodes": tree.num_nodes, "depth": shape.depth, "width": shape.width})  # type: ignore[return-value]


def timed(fn: Callable[[], object], device: str, clock: str) -> float:
    """Milliseconds of one call. `cpu` clock = this process's CPU time (steady on a shared machine with one
    torch thread; meaningless on a GPU, where the wall clock around a synchronize is what counts)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = now()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (now() - start) * 1000


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().amax(-1) / b.abs().amax(-1).clamp_min(1e-9)).max())


def native_kernel() -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None:
    try:
        from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule
    except ImportError:
        return None
    return torch_chunk_gated_delta_rule  # type: ignore[no-any-return]


def row_for(n: int, args: argparse.Namespace, gen: torch.Generator) -> dict[str, object]:
    dev = args.device
    chunk_plan, depth_plan, flat_plan, row = make_plan(n, args.draft, dev, gen)
    n = int(row["nodes"])  # type: ignore[call-overload]
    q = torch.nn.functional.normalize(torch.randn(n, HEADS, DK, device=dev), dim=-1) * DK**-0.5
    k = torch.nn.functional.normalize(torch.randn(n, HEADS, DK, device=dev), dim=-1)
    v = torch.randn(n, HEADS, DV, device=dev)
    g = -torch.rand(n, HEADS, device=dev) * 0.5  # log-decay <= 0
    beta = torch.rand(n, HEADS, device=dev).sigmoid()
    state0 = torch.randn(HEADS, DK, DV, device=dev) * 0.1
    native = native_kernel()

    def run_native() -> torch.Tensor:
        assert native is not None
        out, _ = native(
            (q * DK**0.5)[None], k[None], v[None], g[None], beta[None], initial_state=state0[None].clone(),
            output_final_state=True,
        )  # fmt: skip
        return out[0]

    arms: dict[str, Callable[[], torch.Tensor]] = {
        "chunk": lambda: gdn_recurrence(chunk_plan, q, k, v, g, beta, state0),
        "depth": lambda: gdn_recurrence(depth_plan, q, k, v, g, beta, state0),
        "flat": lambda: gdn_recurrence(flat_plan, q, k, v, g, beta, state0),
    }
    if native is not None:
        arms["native"] = run_native
    with torch.no_grad():
        outs = {name: fn() for name, fn in arms.items()}
        row["chunk_vs_depth"] = max_rel(outs["chunk"], outs["depth"])
        if native is not None:
            row["flat_vs_native"] = max_rel(outs["flat"], outs["native"].to(outs["flat"].dtype))
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.repeat):  # interleaved: drift on a shared machine hits every arm alike
            for name, fn in arms.items():
                times[name].append(timed(fn, dev, args.clock))
    for name, values in times.items():
        row[f"{name}_ms"] = statistics.median(values)
    row["chunk_over_depth"] = row["chunk_ms"] / row["depth_ms"]  # type: ignore[operator]
    row["chunk_over_flat"] = row["chunk_ms"] / row["flat_ms"]  # type: ignore[operator]
    if native is not None:
        row["chunk_over_native"] = row["chunk_ms"] / row["native_ms"]  # type: ignore[operator]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="16,32,64,128,256,512")
    parser.add_argument("--draft", choices=tuple(BOOSTS), nargs="+", default=["flat", "sharp"])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for draft in args.draft:
        for n in (int(x) for x in args.nodes.split(",")):
            gen = torch.Generator().manual_seed(n)
            row = row_for(n, argparse.Namespace(**{**vars(args), "draft": draft}), gen)
            row["draft"] = draft
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        "\n| draft | nodes | depth | width | chunk ms | depth ms | flat ms | native ms | chunk/depth | chunk/flat "
        "| chunk/native | chunk vs depth | flat vs native |"
    )
    print("|---|" + "---:|" * 12)
    for r in rows:
        print(
            f"| {r['draft']} | {r['nodes']} | {r['depth']} | {r['width']} | {r['chunk_ms']:.2f} | {r['depth_ms']:.2f} "
            f"| {r['flat_ms']:.2f} | {r.get('native_ms', float('nan')):.2f} | {r['chunk_over_depth']:.2f} "
            f"| {r['chunk_over_flat']:.2f} | {r.get('chunk_over_native', float('nan')):.2f} "
            f"| {r['chunk_vs_depth']:.1e} | {r.get('flat_vs_native', float('nan')):.1e} |"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {"device": args.device, "threads": torch.get_num_threads(), "clock": args.clock, "rows": rows},
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
