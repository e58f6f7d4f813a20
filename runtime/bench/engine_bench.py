"""Benchmark (not a test): the reference engine end to end, every mode side by side, on the tiny models.

    python -m ddtree.tiny --arch qwen3 --out /tmp/tiny/qwen3        # once per arch (or reuse .cache/tiny)
    python runtime/bench/engine_bench.py --models .cache/tiny --device cpu --repeat 3
    python runtime/bench/engine_bench.py --models .cache/tiny --device cuda --repeat 5

For each arch (dense qwen3, hybrid qwen3_5) and mode (baseline, linear, shadow, tree) it generates greedily
from each prompt set (--prompts: `corpus`, held-out prompts of the tiny models' own domain, where the drafter
accepts long runs; `generic`, off-domain chat, where it does not) with --max-new-tokens, and reports per mode:
rounds per second (verify rounds, or decode steps for baseline), output tokens per second, tau (committed tokens
per round incl. the bonus) and the ratio of tokens/s to baseline. Medians over --repeat passes of the whole
prompt set; every mode's output is checked equal to baseline (a benchmark that changed the output would be
measuring something else).

`--rules penalties` sends every request with frequency, presence and repetition penalties and min_new_tokens
(the rules that read the output so far, `ddtree.acceptance`); `--modes` picks the modes to run. Passes
interleave the modes, and "vs baseline" is the median of each pass's ratio to the baseline's pass beside it;
`--clock process` times the process's CPU time (on a shared CPU, other processes move it far less than the wall
clock; one torch thread).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from ddtree.acceptance import Decoding, RequestRules
from ddtree.config import DDTreeConfig
from ddtree.engine import ReferenceEngine

GENERIC = [
    "Write a short note about the weather in Paris.",
    "List three uses of a paper clip.",
    '{"name": "Ada", "role": "engineer", "skills": [',
    "def fibonacci(n):\n",
    "The quick brown fox",
    "Explain what a hash map is.",
]
MODES = ("baseline", "linear", "shadow", "tree")


def decoding_of(rules: str, stop: set[int]) -> Decoding | None:
    """Greedy; with `penalties`, every rule that reads the output (min_new_tokens suppresses the stop tokens)."""
    if rules == "none":
        return None
    return Decoding(
        rules=RequestRules(
            frequency_penalty=0.4,
            presence_penalty=0.3,
            repetition_penalty=1.2,
            min_new_tokens=8,
            stop_token_ids=frozenset(stop),
        )
    )


def corpus_prompts(n: int) -> list[str]:
    """n held-out prompts of the tiny models' own domain (counting, json, code, ...), never seen in training:
    the same sequence the build's held-out tau is measured on (`ddtree.tiny.build`, seed 0)."""
    from ddtree.tiny import BuildSettings, corpus

    settings = BuildSettings()
    seen = {s.prompt for s, _ in corpus.training_samples(settings.corpus_size, 0)}
    return corpus.heldout_prompts(n, 1000, seen)


def prompt_set(name: str) -> list[str]:
    return GENERIC if name == "generic" else corpus_prompts(len(GENERIC))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_arch(arch_dir: Path, args: argparse.Namespace, prompt_names: str) -> list[dict[str, object]]:
    ddtree = DDTreeConfig(budget=args.budget, topk=args.topk, log_interval=10_000)
    engines = {
        mode: ReferenceEngine.load(
            str(arch_dir / "target"), str(arch_dir / "draft"), mode, ddtree=ddtree, device=args.device
        )
        for mode in args.modes.split(",")
    }
    tok = next(iter(engines.values())).tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, enable_thinking=False, tokenize=True
        )
        for p in prompt_set(prompt_names)
    ]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    # stop where a server stops (the chat's end marker, end of text): past it the tiny models continue with an
    # invented next turn, off their training distribution, and acceptance there says nothing about the answer
    stop = {t for t in (tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id) if isinstance(t, int)}
    stop = stop if args.stop_at_eos else set()
    decoding = decoding_of(args.rules, stop)
    baseline = engines.get("baseline") or ReferenceEngine(engines[next(iter(engines))].model, "baseline")
    reference = [
        baseline.generate(p, args.max_new_tokens, stop_token_ids=stop, decoding=decoding).tokens for p in prompts
    ]
    # process: this process's CPU time, which other processes on a shared machine barely move (1 torch thread)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    for engine in engines.values():
        for p in prompts[:2]:  # warm-up
            engine.generate(p, args.max_new_tokens, stop_token_ids=stop, decoding=decoding)
    # passes interleave the modes (pass 1 of every mode, then pass 2, ...): a shared machine's load then weighs on
    # every mode alike, and each pass gives a paired ratio to baseline
    passes: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in engines}
    for _ in range(args.repeat):
        for mode, engine in engines.items():
            tokens = rounds = 0
            accept: list[int] = []
            sync(args.device)
            start = clock()
            for p, expected in zip(prompts, reference, strict=True):
                result = engine.generate(p, args.max_new_tokens, stop_token_ids=stop, decoding=decoding)
                if result.tokens != expected:
                    raise SystemExit(f"{arch_dir.name}/{mode}: output differs from baseline")
                tokens += len(result.tokens)
                rounds += result.rounds
                accept += result.accept_lengths
            sync(args.device)
            wall = clock() - start
            passes[mode].append((tokens / wall, rounds / wall, statistics.mean(accept) if accept else 1.0))
    rows: list[dict[str, object]] = []
    for mode, runs in passes.items():
        paired = (
            [run[0] / ref[0] for run, ref in zip(runs, passes["baseline"], strict=True)] if "baseline" in passes else []
        )
        rows.append(
            {
                "arch": arch_dir.name,
                "prompts": prompt_names,
                "rules": args.rules,
                "mode": mode,
                "tok_s": statistics.median(p[0] for p in runs),
                "tok_s_min": min(p[0] for p in runs),
                "tok_s_max": max(p[0] for p in runs),
                "rounds_s": statistics.median(p[1] for p in runs),
                "tau": statistics.median(p[2] for p in runs) if mode != "baseline" else 1.0,
                # the median of each pass's ratio to the baseline's pass beside it
                "vs_baseline": statistics.median(paired) if paired else float("nan"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=".cache/tiny", help="folder with <arch>/target and <arch>/draft")
    parser.add_argument("--archs", default="qwen3,qwen3_5")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)}")
    parser.add_argument("--rules", choices=("none", "penalties"), default="none", help="see above")
    parser.add_argument(
        "--clock", choices=("wall", "process"), default="wall", help="process: CPU time (CPU, 1 torch thread)"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--no-stop-at-eos", dest="stop_at_eos", action="store_false", help="generate max-new-tokens past the end"
    )
    parser.add_argument(
        "--prompts",
        default="corpus,generic",
        help="prompt sets: corpus (held-out prompts of the tiny models' own domain), generic (off-domain chat)",
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for arch in args.archs.split(","):
        for names in args.prompts.split(","):
            for row in run_arch(Path(args.models) / arch, args, names):
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        f"\ndevice {args.device}, max_new_tokens {args.max_new_tokens}, budget {args.budget}, topk {args.topk}, "
        f"stop at end of turn {args.stop_at_eos}, rules {args.rules}, clock {args.clock}\n"
    )
    print("| arch | prompts | rules | mode | rounds/s | tok/s (median) | tok/s min-max | tau | vs baseline (paired) |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['arch']} | {r['prompts']} | {r['rules']} | {r['mode']} | {r['rounds_s']:.1f} | {r['tok_s']:.1f} | "
            f"{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f} | {r['tau']:.2f} | {r['vs_baseline']:.2f}x |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
