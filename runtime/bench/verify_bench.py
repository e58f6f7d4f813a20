"""Benchmark (not a test), for a GPU: one tree-verify forward of a Qwen3.6-27B-shaped hybrid target.

    python runtime/bench/verify_bench.py --layers 64 --nodes 1,16,32,64,128,256,512 --repeat 10
    python runtime/bench/verify_bench.py --shape small --layers 4 --device cpu --dtype float32 --repeat 2  # smoke

Random bf16 weights with Qwen3.6-27B's layer shapes (hidden 5120, MLP 17408, 24 query / 4 KV heads of 256,
Gated DeltaNet 16 key / 48 value heads of 128, conv kernel 4, 3 GDN layers per full-attention layer, vocab
248320). For every node count N it times, after a committed prefix of --prefix tokens:

- `exact`:  TargetRunner.verify with exact hybrid handling + commit (GDN: the ancestor-masked chunked form)
- `exact_depth`: the same with the depth-by-depth GDN method (one recurrent step per depth from parent states)
- `unsafe`: the same tree through the flat-order GDN path (what a naive tree verify does) + commit
- `chain`:  a plain transformers forward of N tokens (the model's own GDN kernel; what a chain verify costs)
- `tree_ops`: build_tree + compile_tree + walk_tree for that budget (the per-round CPU/GPU bookkeeping)

Trees come from build_tree over synthetic drafter log-probs (block 16, top-k 8), so their shape is a real
DDTree shape (depth <= 15); `--draft sharp` makes the top token more likely at every position, which gives the
deep trees of a well-trained drafter. Medians over --repeat runs after warm-up, CUDA-synchronized. Each row also
reports `chunk_vs_depth`: the max relative difference of the two exact methods' logits (in the bench dtype).
`--profile N` prints the top operators of one exact round of about N nodes (torch.profiler). Prints JSON lines
and a markdown table; --out writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from ddtree.hybrid import GDNMethod
from ddtree.tree import build_tree, compile_tree, tree_shape, walk_tree
from ddtree.verify import HybridMode, TargetRunner

SHAPE_27B = dict(
    hidden_size=5120,
    intermediate_size=17408,
    num_attention_heads=24,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    vocab_size=248320,
)
# A small shape with the same structure, to check the script itself on a CPU (--shape small).
SHAPE_SMALL = dict(
    SHAPE_27B,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    head_dim=64,
    linear_num_value_heads=8,
    linear_num_key_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    vocab_size=4096,
)
BLOCK = 16
TOPK = 8


def build_model(layers: int, device: str, dtype: torch.dtype, shape: dict[str, int]) -> torch.nn.Module:
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    config = Qwen3_5TextConfig(num_hidden_layers=layers, layer_types=layer_types, **shape)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)  # cast on meta first: never materialize fp32 27B weights
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02, generator=gen)
            elif "A_log" in name:
                param.uniform_(0.0, 2.0, generator=gen)
            elif "norm" in name:
                param.fill_(1.0 if "layernorm" not in name and param.dtype.is_floating_point else 0.0)
            else:
                param.zero_()
        for buffer_name, buffer in model.named_buffers():
            if "inv_freq" in buffer_name:  # rotary frequencies are computed, not loaded: recompute on device
                dim = buffer.shape[0] * 2
                base = float(getattr(config, "rope_theta", 1e7) or 1e7)
                buffer.copy_(1.0 / (base ** (torch.arange(0, dim, 2, device=device).float() / dim)))
    return model.eval()


def timed(fn: Callable[[], object], repeat: int, device: str) -> float:
    """Median seconds of fn over `repeat` runs after two warm-ups."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


BOOSTS = {"flat": [9.0, 7.0, 6.0, 5.0], "sharp": [16.0, 11.0, 10.0, 9.0]}  # added to 4 random tokens per row


def synthetic_logprobs(vocab: int, device: str, gen: torch.Generator, draft: str = "flat") -> torch.Tensor:
    logits = torch.randn(BLOCK - 1, vocab, device=device, generator=gen)
    boost = torch.randint(0, vocab, (BLOCK - 1, 4), device=device, generator=gen)
    logits.scatter_add_(1, boost, torch.tensor(BOOSTS[draft], device=device).expand(BLOCK - 1, 4))
    return torch.log_softmax(logits, dim=-1)  # [D, V]


Runners = dict[str, TargetRunner]


def make_runners(model: torch.nn.Module) -> Runners:
    return {
        "exact": TargetRunner(model, hybrid_mode=HybridMode.EXACT, gdn_method=GDNMethod.CHUNK),
        "exact_depth": TargetRunner(model, hybrid_mode=HybridMode.EXACT, gdn_method=GDNMethod.DEPTH),
        "unsafe": TargetRunner(model, hybrid_mode=HybridMode.UNSAFE),
    }


def make_tree(n: int, prompt: list[int], vocab: int, gen: torch.Generator, args: argparse.Namespace) -> Any:
    draft = synthetic_logprobs(vocab, args.device, gen, args.draft)
    if n > 1:
        return draft, build_tree(draft, root_token=prompt[-1], budget=n - 1, topk=TOPK)
    from ddtree.tree import spine_tree

    return draft, spine_tree(draft, root_token=prompt[-1], depth=0)


def one_round(runner: TargetRunner, tree: Any) -> torch.Tensor:
    """Verify + walk + commit; keeps only the root, so the prefix grows by one per call. Returns the logits."""
    out = runner.verify(compile_tree(tree, runner.prefix_len))
    walk = walk_tree(tree, out.logits)
    runner.commit(walk.accepted[:1])
    return out.logits


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.float() - b.float()).abs().amax(-1) / b.float().abs().amax(-1).clamp_min(1e-9)).max())


def measure(
    n: int,
    model: torch.nn.Module,
    runners: Runners,
    prompt: list[int],
    vocab: int,
    gen: torch.Generator,
    args: argparse.Namespace,
) -> dict[str, object]:
    """One row: every runner's round, the chain forward and the tree ops for a tree of about n nodes."""
    draft, tree = make_tree(n, prompt, vocab, gen, args)
    shape = tree_shape(tree)
    row: dict[str, object] = {"nodes": tree.num_nodes, "depth": shape.depth, "width": shape.width}
    # Both exact methods at the same prefix length: their logits must agree (bench dtype).
    with torch.no_grad():
        row["chunk_vs_depth"] = max_rel(one_round(runners["exact"], tree), one_round(runners["exact_depth"], tree))
    for name, runner in runners.items():
        row[f"{name}_ms"] = timed(lambda runner=runner: one_round(runner, tree), args.repeat, args.device) * 1000
    chain_ids = torch.randint(0, vocab, (1, tree.num_nodes), generator=gen, device=args.device)

    def chain_forward() -> None:
        with torch.no_grad():
            model(input_ids=chain_ids, use_cache=False)

    row["chain_ms"] = timed(chain_forward, args.repeat, args.device) * 1000
    logits = torch.randn(max(tree.num_nodes, 2), vocab, device=args.device, generator=gen)

    def tree_ops() -> None:
        t = build_tree(draft, root_token=prompt[-1], budget=max(n - 1, 1), topk=TOPK)
        compile_tree(t, args.prefix)
        walk_tree(t, logits[: t.num_nodes])

    row["tree_ops_ms"] = timed(tree_ops, args.repeat, args.device) * 1000
    row["exact_over_unsafe"] = row["exact_ms"] / row["unsafe_ms"]  # type: ignore[operator]
    row["exact_over_chain"] = row["exact_ms"] / row["chain_ms"]  # type: ignore[operator]
    row["tree_ops_share_of_exact"] = row["tree_ops_ms"] / row["exact_ms"]  # type: ignore[operator]
    return row


def profile_round(n: int, runner: TargetRunner, prompt: list[int], vocab: int, args: argparse.Namespace) -> None:
    """Top operators of one exact round (after warm-up), by device time on a GPU, CPU time otherwise."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator(device=args.device).manual_seed(7)
    _, tree = make_tree(n, prompt, vocab, gen, args)
    with torch.no_grad():
        for _ in range(2):
            one_round(runner, tree)
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad(), profile(activities=activities) as prof:
        one_round(runner, tree)
        if cuda:
            torch.cuda.synchronize()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    print(f"\n# profile: one exact round, {tree.num_nodes} nodes\n", flush=True)
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--nodes", default="1,16,32,64,128,256,512")
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None)
    parser.add_argument("--shape", choices=("27b", "small"), default="27b")
    parser.add_argument("--draft", choices=tuple(BOOSTS), default="flat")
    parser.add_argument("--profile", type=int, default=0, help="profile one exact round of about N nodes")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    nodes = [int(n) for n in args.nodes.split(",")]

    start = time.perf_counter()
    shape = SHAPE_27B if args.shape == "27b" else SHAPE_SMALL
    model = build_model(args.layers, args.device, dtype, shape)
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        f"# model: {args.layers} layers, {params / 1e9:.2f}B params, {weight_bytes / 1e9:.1f} GB, built in "
        f"{time.perf_counter() - start:.1f}s on {args.device}",
        flush=True,
    )
    vocab = shape["vocab_size"]
    gen = torch.Generator(device=args.device).manual_seed(1)
    prompt = torch.randint(0, vocab, (args.prefix,), generator=gen, device=args.device).tolist()

    runners = make_runners(model)
    with torch.no_grad():
        for runner in runners.values():
            runner.prefill(prompt)
    results = []
    for n in nodes:
        row = measure(n, model, runners, prompt, vocab, gen, args)
        results.append(row)
        print(json.dumps(row), flush=True)

    if args.profile:  # last: it advances one runner's prefix, and the rows compare runners at equal prefixes
        profile_round(args.profile, runners["exact"], prompt, vocab, args)
    floor_ms = weight_bytes / 4.2e12 * 1000  # measured H200 copy bandwidth (docs/architecture.md)
    print(f"\nweights {weight_bytes / 1e9:.1f} GB -> memory floor {floor_ms:.1f} ms per forward at 4.2 TB/s\n")
    print(
        "| nodes | depth | width | exact ms | exact (depth method) ms | unsafe ms | chain ms | exact/unsafe "
        "| exact/chain | chunk vs depth | tree ops ms | ops/exact |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['nodes']} | {r['depth']} | {r['width']} | {r['exact_ms']:.1f} | {r['exact_depth_ms']:.1f} | "
            f"{r['unsafe_ms']:.1f} | {r['chain_ms']:.1f} | {r['exact_over_unsafe']:.2f} | "
            f"{r['exact_over_chain']:.2f} | {r['chunk_vs_depth']:.1e} | {r['tree_ops_ms']:.2f} | "
            f"{100 * r['tree_ops_share_of_exact']:.1f}% |"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "layers": args.layers,
                    "draft": args.draft,
                    "prefix": args.prefix,
                    "params": params,
                    "weight_bytes": weight_bytes,
                    "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                    "floor_ms": floor_ms,
                    "rows": results,
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
