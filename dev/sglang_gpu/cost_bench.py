"""Cost at real shapes: DFLASH vs DDTREE (tree) round time inside SGLang 0.5.23's real Engine, on
random-weight models with real layer shapes (`load_format="dummy"`: SGLang builds the model from config.json
and fills it with random values, no weight files).

    bash dev/sglang_gpu/run.sh cost --models dense --batches 1,8,32           # on the GPU host (run.sh: wheels,
    python dev/sglang_gpu/cost_bench.py --configs-only --cache /tmp/shapes    # the runtime, the stand-in)

Models (config dirs written under `--cache`/real_shapes):
- dense: Qwen3-8B's shapes (36 layers, hidden 4096, MLP 12288, 32 query / 8 KV heads of 128, vocabulary 151936)
  and a DFlash drafter of z-lab's Qwen3-8B-DFlash-b16 shape (5 layers of the target's width, block 16, fed
  target layers 1, 9, 17, 25, 33);
- hybrid: Qwen3.6-27B's shapes (64 layers: 48 Gated DeltaNet + 16 gated attention, hidden 5120, MLP 17408, 24
  query / 4 KV heads of 256, GDN 16 key / 48 value heads of 128, conv 4, vocabulary 248320) and a drafter of the
  same form at width 5120 (5 layers, block 16, fed target layers 1, 16, 31, 46, 61). GDN states in bfloat16
  (`SGLANG_MAMBA_SSM_DTYPE`; float32 per-step verify states for 32 requests would need ~77 GB beside 54 GB of
  weights).

Per (model, mode, CUDA graphs) one Engine in its own process; Engines of one model start together and are then
measured one at a time (`--parallel`, default 1: Engines started together race SGLang's memory profiling).
Each runs every batch size once unmeasured
(graphs, Triton compiles), then per batch size `bs` requests of `--prefix` random prompt tokens decoding
`--new-tokens` tokens (greedy, ignore_eos). `standin/round_timer.py` times every decode round with CUDA events
(draft / build / verify / commit; see there); the report takes medians over the rounds of each batch size
(skipping the first `--skip` rounds), plus the step interval (host time between consecutive rounds' starts,
the scheduler's work included). Random weights make acceptance meaningless (tau ~ 1 here), so compare cost per
round; `--tau` turns it into tok/s for given acceptance lengths (labelled as such).

DDTREE on a hybrid target replays its verify from the GDN tree path's graphs (ddtree.sglang.hybrid_graphs).

Modes `baseline` (the target alone) and `tree<N>` (a tree of N nodes, e.g. tree7,tree15,tree31 in one run), and
`--replay PATHS`: every tree round builds a real pair's recorded tree shapes and commits its recorded
paths (`DDTREE_REPLAY_ACCEPTANCE`, ddtree.sglang.replay; a `ddtree-paths/2` file from `DDTREE_RECORD_PATHS`; a
`ddtree-paths/1` file has paths only, which the random drafter's wide, shallow trees cut short) while doing all
its work, so its step time and tokens per round are the shape's cost at that acceptance; `--replay-report
cost.json --dflash-tau 2.11` prints tok/s per request and per GPU against DFLASH's step at the pair's tau
(projected: DFLASH's own rounds are SGLang's and take no replay):

    python dev/sglang_gpu/cost_bench.py --models hybrid --modes baseline,dflash,tree7,tree15,tree31 --graphs on \
        --batches 1,2,4,8,16,32,64 --new-tokens 256 --replay paths-hybrid.json   # then --replay-report

`--fair` (the fair replay): DFLASH replays the same pair's recorded accepted lengths (`--replay-dflash`, a
`ddtree-accepts/1` file recorded by the stand-in's R1 patch, `standin/dflash_replay.py`) while the tree replays
its paths (`--replay`), so both modes commit, move KV and recurrent state for real acceptance; every batch size
replays the same recorded requests (`fair_replay.level_requests`: all of them, at least 16, cycled, in as many
batches of `bs` as that takes; request ids `replay-<i>-...` name the recorded request); `--temperature` samples
(recordings made at that temperature). `--fair-report cost.json --replay P --replay-dflash A` prints per batch
size each mode's tau as recorded and as replayed, steps, the replays' own host time per round (taken out of the
per-request tok/s), and tree / DFLASH with a bootstrap interval over the recorded requests:

    python dev/sglang_gpu/cost_bench.py --models hybrid --modes dflash,tree15 --graphs on --batches 1,2,4,8 \
        --new-tokens 128 --fair --replay paths.json --replay-dflash accepts.json --json fair.json

Mode `tree-policy`: tree mode with DDTREE_POLICY=auto, the worker choosing tree, smaller tree or
DFLASH's chain per round and batch-size bucket (ddtree.sglang.policy_glue); its DDTREE metrics lines (every 64
request-rounds) carry the choice. `--policy-report` compares decode tok/s (output tokens / wall time of each
measured batch) of dflash, tree and tree-policy per model and batch size, with the policy's last choice:

    python dev/sglang_gpu/cost_bench.py --models dense,hybrid --modes dflash,tree,tree-policy --graphs on \
        --batches 1,2,4,8,16,32 --new-tokens 512 --json policy.json   # then: --policy-report policy.json

Each batch size runs once before it is measured (8 tokens: a few rounds of its bucket); a bucket keeps the
configured tree for its first 64 rounds (the policy's dwell), so use >= 512 new tokens for the switch to be a
small part of the measured batch. With random weights (tau ~ 1 for every shape) the right answer is the chain
at every batch size, so tree-policy should land within noise of dflash. Trained pairs and the real-text sweep:
dev/sglang_gpu/pairs_bench.py.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TINY = REPO / ".cache" / "sglang_gpu"

DENSE_TARGET = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": None,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 36,
    "dtype": "bfloat16",
}
HYBRID_LAYERS = 64
HYBRID_TARGET = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": HYBRID_LAYERS,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(HYBRID_LAYERS)],
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_value_head_dim": 128,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "eos_token_id": 248044,
    "pad_token_id": None,
    "use_cache": True,
    "dtype": "bfloat16",
}


def drafter(target: dict[str, Any], layer_ids: list[int], mask_token_id: int) -> dict[str, Any]:
    """A DFlash drafter config (the form SGLang's DFlashDraftModel reads; the tiny drafters' keys) of the target's
    width: 5 Qwen3 layers, 32 query / 8 KV heads of 128, block 16."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 16,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": layer_ids},
        "hidden_size": target["hidden_size"],
        "intermediate_size": target["intermediate_size"],
        "num_hidden_layers": 5,
        "layer_types": ["full_attention"] * 5,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_target_layers": target["num_hidden_layers"],
        "vocab_size": target["vocab_size"],
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": target["eos_token_id"],
        "pad_token_id": None,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 5,
        "initializer_range": 0.02,
        "dtype": "bfloat16",
    }


MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "dense": (DENSE_TARGET, drafter(DENSE_TARGET, [1, 9, 17, 25, 33], 151669)),
    "hybrid": (HYBRID_TARGET, drafter(HYBRID_TARGET, [1, 16, 31, 46, 61], 248070)),
}
# dflash: SGLang's DFLASH; tree: DDTREE tree; tree-es: DDTREE tree with SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1 (the
# drafter's CUDA graph without DFLASH's greedy head); tree-old: DDTREE tree with the runtime under --old-runtime
# first on PYTHONPATH (a before/after comparison in one call); dflash-rep: a second DFLASH Engine, the same settings
# (the run-to-run spread of one configuration)
MODES = ("dflash", "dflash-rep", "tree", "tree-es", "tree-old")
# Acceptance lengths to turn round times into tok/s (labelled where printed). DDTree paper (arXiv 2604.12989,
# Table 1, Qwen3-8B, temperature 0; its DDTree column uses the best budget of 16..1024, i.e. more than 15 nodes):
PAPER_TAU = {
    "MATH-500": (7.79, 10.73),
    "HumanEval": (6.61, 9.67),
    "MT-Bench": (4.28, 6.58),
    "Alpaca": (3.12, 5.09),
}


def write_configs(root: Path) -> dict[str, Path]:
    """root/<model>/{target,draft}/config.json (+ the tiny pair's tokenizer files, unused: skip_tokenizer_init)."""
    out = {}
    for name, (target, draft) in MODELS.items():
        for role, config in (("target", target), ("draft", draft)):
            d = root / name / role
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(config, indent=1))
        out[name] = root / name
    return out


# ---------------------------------------------------------------- one Engine (child process)


def tokens_digest(output_ids: list[list[int]]) -> str:
    """One batch's greedy tokens, as a digest: equal digests across modes = the same tokens, request for request."""
    return hashlib.sha256(json.dumps(output_ids).encode()).hexdigest()


def engine_child(job_path: Path, result_path: Path) -> None:
    """Start the Engine, signal ready, wait for go, run the batches (each once as warm-up first)."""
    job = json.loads(job_path.read_text())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang

    run_dir = job_path.parent
    started = time.monotonic()
    engine = sglang.Engine(**job["engine"])
    startup_s = time.monotonic() - started
    (run_dir / "ready").write_text(f"{startup_s:.1f}")
    deadline = time.monotonic() + job["wait_s"]
    while not (run_dir / "go").exists():
        if time.monotonic() > deadline:
            engine.shutdown()
            raise SystemExit("never told to go")
        time.sleep(0.2)
    timer = Path(job["timer"])
    rng = random.Random(job["seed"])
    vocab = job["vocab"]
    out: dict[str, Any] = {"startup_s": startup_s, "batches": []}

    def prompts(bs: int) -> list[list[int]]:
        return [[rng.randrange(1000, vocab - 1000) for _ in range(job["prefix"])] for _ in range(bs)]

    def mark(text: str) -> None:
        with timer.open("a") as f:
            f.write(json.dumps({"marker": text}) + "\n")

    if job.get("fair"):  # the fair replay: the same recorded requests at every batch size
        sys.path.insert(0, str(HERE))
        from ddtree.sglang.replay import replay_rid

        from fair_replay import level_requests

    try:
        for bs in job["batches"]:  # warm-up: graphs, Triton compiles, allocator
            mark(f"warmup {bs}")
            engine.generate(input_ids=prompts(bs), sampling_params={**job["sampling"], "max_new_tokens": 8})
        for repeat in range(job.get("repeats", 1)):
            # every other repeat in the reverse order, so no batch size always runs right after the warm-up
            order = job["batches"] if repeat % 2 == 0 else job["batches"][::-1]
            for bs in order:
                if job.get("fair"):
                    for w, indices in enumerate(level_requests(bs, job["fair"], job["fair_minimum"])):
                        mark(f"measure {bs}")  # one timer segment per batch: the prefill between is no step
                        rids = [replay_rid(i, f"{bs}-{repeat}-{w}-{k}") for k, i in enumerate(indices)]
                        t0 = time.monotonic()
                        outs = engine.generate(input_ids=prompts(bs), sampling_params=job["sampling"], rid=rids)
                        wall = time.monotonic() - t0
                        mark(f"done {bs}")
                        meta = [o["meta_info"] for o in outs]
                        out["batches"].append(
                            {"bs": bs, "repeat": repeat, "wave": w, "wall_s": wall, "indices": indices,
                             "out_lens": [len(o["output_ids"]) for o in outs],
                             "verify_ct": [m.get("spec_verify_ct") for m in meta],
                             "accept": [m.get("spec_accept_length") for m in meta],
                             "output_ids_sha256": tokens_digest([o["output_ids"] for o in outs])}
                        )  # fmt: skip
                    continue
                mark(f"measure {bs}")
                t0 = time.monotonic()
                outs = engine.generate(input_ids=prompts(bs), sampling_params=job["sampling"])
                wall = time.monotonic() - t0
                mark(f"done {bs}")
                accept = [o["meta_info"].get("spec_accept_length") for o in outs]
                out["batches"].append(
                    {"bs": bs, "repeat": repeat, "wall_s": wall, "out_lens": [len(o["output_ids"]) for o in outs],
                     "accept": accept, "output_ids_sha256": tokens_digest([o["output_ids"] for o in outs])}
                )  # fmt: skip
    finally:
        engine.shutdown()
    result_path.write_text(json.dumps(out))


# ---------------------------------------------------------------- parent


def engine_kwargs(pair: Path, model: str, mode: str, graphs: bool, args: argparse.Namespace) -> dict[str, Any]:
    max_bs = max(args.batches)
    kwargs: dict[str, Any] = {
        "model_path": str(pair / "target"),
        "load_format": "dummy",
        "speculative_draft_load_format": "dummy",
        "skip_tokenizer_init": True,
        "device": "cuda",
        "dtype": "bfloat16",
        "attention_backend": "triton",
        "sampling_backend": "pytorch",
        "page_size": 1,
        "disable_overlap_schedule": True,
        "disable_radix_cache": True,
        "disable_cuda_graph": not graphs,
        "mem_fraction_static": args.mem_fraction_hybrid if model == "hybrid" else args.mem_fraction_dense,
        "max_running_requests": max_bs,
        "context_length": args.prefix + args.new_tokens + 256,
        "skip_server_warmup": True,
        "random_seed": 0,
        "log_level": "info",
        "speculative_algorithm": "DFLASH" if mode.startswith("dflash") else "DDTREE",
        "speculative_draft_model_path": str(pair / "draft"),
    }
    if mode == "baseline":  # the target alone: no drafter, no speculative algorithm
        for key in ("speculative_algorithm", "speculative_draft_model_path", "speculative_draft_load_format"):
            kwargs.pop(key)
    if graphs:
        kwargs["cuda_graph_bs_decode"] = sorted(set(args.batches))
        kwargs["disable_prefill_cuda_graph"] = True
    if model == "hybrid":
        kwargs["json_model_override_args"] = json.dumps({"full_attention_interval": 4})
        kwargs["max_mamba_cache_size"] = max_bs + 8
    return kwargs


def run_env(model: str, mode: str, args: argparse.Namespace, timer: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "DDTREE_ROUND_TIMER": str(timer)}
    env["DDTREE_LOOP_TIMER"] = str(timer.with_name("loop.jsonl"))  # standin/loop_timer.py: the scheduler's phases
    if args.loop_profile:
        env["DDTREE_LOOP_PROFILE"] = str(timer.with_name("loop.prof"))
    if model == "hybrid":
        env["SGLANG_MAMBA_SSM_DTYPE"] = "bfloat16"
    if mode == "tree-es":
        env["SGLANG_DFLASH_EAGER_DRAFT_SAMPLER"] = "1"
    if mode == "tree-old":
        if args.old_runtime is None:
            raise SystemExit("mode tree-old needs --old-runtime")
        env["PYTHONPATH"] = os.pathsep.join([str(args.old_runtime.resolve()), env.get("PYTHONPATH", "")])
    if mode.startswith("tree"):
        sized = re.fullmatch(r"tree(\d+)", mode)  # tree<N>: a tree of N nodes, else --budget
        env.update(
            DDTREE_VERIFY="tree",
            DDTREE_BUDGET=str(int(sized.group(1)) if sized else args.budget),
            DDTREE_TOPK=str(args.topk),
            DDTREE_LOG_INTERVAL="1000",
            DDTREE_ALLOW_HYBRID_UNSAFE="0",
        )
        if args.replay is not None:  # the rounds commit a real pair's recorded paths (ddtree.sglang.replay)
            env["DDTREE_REPLAY_ACCEPTANCE"] = str(args.replay.resolve())
    if mode.startswith("dflash") and args.replay_dflash is not None:  # the stand-in's R1: recorded lengths
        env["DDTREE_DFLASH_REPLAY"] = str(args.replay_dflash.resolve())
    if mode == "tree-policy":
        env.update(DDTREE_POLICY="auto", DDTREE_LOG_INTERVAL="64")
    if mode == "tree-chain":  # the policy pinned to DFLASH's chain: a chain round's cost inside the tree worker
        env.update(DDTREE_POLICY="chain", DDTREE_LOG_INTERVAL="64")
    return env


def mode_of(name: str) -> str:
    """`dense-tree-policy-graph` -> `tree-policy` (run names are model-mode-graphs)."""
    return name.split("-", 1)[1].rsplit("-", 1)[0]


def policy_choice(log: str) -> str:
    """The `choice=` of the last DDTREE metrics line in an engine log ("" without one)."""
    choices = re.findall(r"DDTREE metrics .*?\bchoice=(\S+)", log)
    return choices[-1] if choices else ""


def decode_tok_s(entry: dict[str, Any]) -> dict[str, float]:
    """bs -> output tokens / wall seconds of its measured batches (the whole generate call, prefill included),
    the median over `--repeats`."""
    rates: dict[str, list[float]] = {}
    for b in (entry.get("result") or {}).get("batches", []):
        if b.get("wall_s"):
            rates.setdefault(str(b["bs"]), []).append(sum(b["out_lens"]) / b["wall_s"])
    return {bs: statistics.median(vals) for bs, vals in rates.items()}


def same_tokens(runs: dict[str, dict[str, Any]], names: list[str]) -> bool | None:
    """Whether every run in `names` produced the same tokens for every (bs, repeat); None when < 2 ran."""
    digests = []
    for name in names:
        batches = (runs.get(name, {}).get("result") or {}).get("batches")
        if batches:
            digests.append(sorted((b["bs"], b.get("repeat", 0), b["output_ids_sha256"]) for b in batches))
    return None if len(digests) < 2 else all(d == digests[0] for d in digests)


POLICY_ARMS = ("dflash", "tree", "tree-chain", "tree-policy")


def policy_table(reports: list[dict[str, Any]]) -> str:
    """Per model, CUDA graphs and batch size: tok/s (medians over repeats) of dflash, tree, tree-chain (DDTREE
    with the policy pinned to the chain: what a chain round costs inside the tree worker) and tree-policy;
    tree-policy / the better of dflash and tree (the policy's goal: >= 0.97 everywhere) and the policy's last
    choice; whether every arm's tokens were equal."""
    runs = {name: entry for rep in reports for name, entry in rep["runs"].items() if entry.get("result")}
    out = ["| model | graphs | bs | " + " | ".join(f"{m} tok/s" for m in POLICY_ARMS) + " | policy / best | choice |",
           "|---|---|---:|" + "---:|" * len(POLICY_ARMS) + "---:|---|"]  # fmt: skip
    for model, graphs in itertools.product(("dense", "hybrid"), ("graph", "eager")):
        names = {m: f"{model}-{m}-{graphs}" for m in POLICY_ARMS}
        if names["tree-policy"] not in runs:
            continue
        rates = {m: decode_tok_s(runs[n]) if n in runs else {} for m, n in names.items()}
        choice = runs[names["tree-policy"]].get("policy_choice") or "-"
        for bs, rate in sorted(rates["tree-policy"].items(), key=lambda kv: int(kv[0])):
            others = [rates[m][bs] for m in ("dflash", "tree") if bs in rates[m]]
            best = max(others) if others else None
            cells = [f"{rates[m][bs]:.1f}" if bs in rates[m] else "-" for m in POLICY_ARMS]
            ratio = f"{rate / best:.3f}" if best else "-"
            out.append(f"| {model} | {graphs} | {bs} | {' | '.join(cells)} | {ratio} | {choice} |")
        equal = same_tokens(runs, list(names.values()))
        out.append(f"\n{model} {graphs}: tokens equal across {', '.join(m for m in POLICY_ARMS if names[m] in runs)}:"
                   f" {equal}\n")  # fmt: skip
    return "\n".join(out)


def replay_table(reports: list[dict[str, Any]], dflash_tau: float) -> str:
    """The table at a real shape with replayed acceptance, per model and batch size (CUDA graphs): tok/s
    per request and per GPU (TP 1) of the baseline (output tokens / wall of the batch), DFLASH (its measured step
    times the real pair's `dflash_tau`: projected, its rounds accept ~1 token on random weights) and every tree<N>
    run (its measured step and the accepted tokens per request-round it measured: the replayed paths'), and each
    tree over DFLASH with the range over the measured batches' step times. A step is one decode round plus the
    scheduler's work up to the next (`summarize`'s step_ms)."""
    runs = {name: entry for rep in reports for name, entry in rep["runs"].items() if entry.get("result")}
    out = ["| model | bs | mode | tokens per request-round | step ms | tok/s per request | tok/s per GPU | "
           "over DFLASH |", "|---|---:|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for model in ("dense", "hybrid"):
        trees = sorted(
            (n for n in runs if n.startswith(f"{model}-tree") and re.fullmatch(r"tree\d+", mode_of(n))),
            key=lambda n: int(mode_of(n)[4:]),
        )
        base, dflash = runs.get(f"{model}-baseline-graph"), runs.get(f"{model}-dflash-graph")
        sizes = sorted({int(bs) for n in trees for bs in runs[n].get("rounds", {})})
        for bs in sizes:
            if base is not None and str(bs) in (rates := decode_tok_s(base)):
                per_req = rates[str(bs)] / bs
                out.append(f"| {model} | {bs} | baseline | 1 | - | {per_req:.1f} | {rates[str(bs)]:.1f} | - |")
            ref = None
            row = (dflash or {}).get("rounds", {}).get(str(bs), {})
            if row.get("step_ms"):
                ref = dflash_tau / row["step_ms"] * 1e3
                out.append(f"| {model} | {bs} | DFLASH (tau {dflash_tau:g}, projected) | {dflash_tau:g} | "
                           f"{row['step_ms']:.2f} | {ref:.1f} | {ref * bs:.1f} | 1.00 |")  # fmt: skip
            for name in trees:
                row = runs[name].get("rounds", {}).get(str(bs), {})
                if not row.get("step_ms") or not row.get("tau"):
                    continue
                rate = row["tau"] / row["step_ms"] * 1e3
                ratio = f"{rate / ref:.3f}" if ref else "-"
                out.append(f"| {model} | {bs} | {mode_of(name)} (replayed) | {row['tau']:.2f} | {row['step_ms']:.2f} | "
                           f"{rate:.1f} | {rate * bs:.1f} | {ratio} |")  # fmt: skip
    return "\n".join(out)


def recordings(args: argparse.Namespace) -> tuple[list[list[int]], list[list[int]]]:
    """(DFLASH's accepted lengths, the tree's accepted path lengths) per recorded request, from the files."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from ddtree.sglang.replay import AcceptanceReplay, LengthReplay

    dflash = [list(r) for r in LengthReplay.from_file(args.replay_dflash).requests]
    tree = [[len(p) for p in r.paths] for r in AcceptanceReplay.from_file(args.replay).requests]
    return dflash, tree


def fair_count(args: argparse.Namespace) -> int:
    """How many recorded requests the fair replay cycles through: those both recordings hold."""
    dflash, tree = recordings(args)
    return min(len(dflash), len(tree))


def fair_table(reports: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The fair replay's table per model and tree mode (fair_replay.report_row: recording vs replayed tau, steps,
    the replays' host time, tok/s per request, tree / DFLASH with its bootstrap interval over requests)."""
    recorded_d, recorded_t = recordings(args)  # puts this directory on the path
    import fair_replay as fr

    new_tokens = int(reports[0]["args"]["new_tokens"])  # the run's, not this command line's
    temperature = float(reports[0]["args"].get("temperature", 0.0))
    runs = {name: entry for rep in reports for name, entry in rep["runs"].items() if entry.get("result")}
    taus = f"DFLASH tau {fr.recording_tau(recorded_d, 15):.2f}, tree tau {fr.recording_tau(recorded_t, 15):.2f}"
    out = [f"recordings: {taus} over all their rounds ({len(recorded_d)} and {len(recorded_t)} requests)"]

    def level(entry: dict[str, Any], bs: int) -> Any:
        batches = [b for b in entry["result"]["batches"] if b["bs"] == bs and "indices" in b]
        row = entry.get("rounds", {}).get(str(bs), {})
        if not batches or not row.get("step_ms"):
            return None
        flat = {k: [v for b in batches for v in b[k]] for k in ("indices", "out_lens", "verify_ct", "accept")}
        verify, accept = [v or 0 for v in flat["verify_ct"]], [a or 0.0 for a in flat["accept"]]
        replay_ms = row.get("replay_host_ms") or 0.0
        return fr.ModeLevel(flat["indices"], flat["out_lens"], verify, accept, row["step_ms"], replay_ms)

    for model in ("dense", "hybrid"):
        dflash = runs.get(f"{model}-dflash-graph") or runs.get(f"{model}-dflash-eager")
        trees = sorted(n for n in runs if n.startswith(f"{model}-tree") and re.fullmatch(r"tree\d*", mode_of(n)))
        for name in trees:
            rows = []
            for bs in sorted({b["bs"] for b in runs[name]["result"]["batches"]}):
                d, t = (level(dflash, bs) if dflash else None), level(runs[name], bs)
                if d is not None and t is not None:
                    rows.append(fr.report_row(bs, d, t, (recorded_d, recorded_t), new_tokens, (15, 15)))
            if rows:
                out += [f"\n{model}: {mode_of(name)} vs DFLASH, temperature {temperature:g}\n", fr.table(rows)]
    return "\n".join(out)


LOOP_PHASES = ("ingest", "next", "round", "run", "process", "loop")


def summarize_loop(path: Path, batches: list[int], skip: int) -> dict[str, Any]:
    """Medians of the scheduler loop's phases (standin/loop_timer.py) per batch size; `between` = loop - round,
    the host time outside the worker's round (the round here is host time, its timer's wait for the GPU
    included)."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    out: dict[str, Any] = {}
    for bs in batches:
        recs = [r for r in lines if r["bs"] == bs][skip:]
        if not recs:
            continue
        row: dict[str, Any] = {"iterations": len(recs)}
        for key in LOOP_PHASES:
            row[key] = statistics.median([r.get(key, 0.0) for r in recs])
        row["between"] = statistics.median([r["loop"] - r.get("round", 0.0) for r in recs])
        out[str(bs)] = row
    return out


def summarize(timer: Path, batches: list[int], skip: int) -> dict[str, Any]:
    """Medians per measured batch size from the timer file."""
    lines = [json.loads(x) for x in timer.read_text().splitlines() if x.strip()] if timer.is_file() else []
    phase: str | None = None
    segments: dict[int, list[list[dict[str, Any]]]] = {bs: [] for bs in batches}  # one per measured batch
    for rec in lines:
        if "marker" in rec:
            kind, bs_text = rec["marker"].split()
            phase = bs_text if kind == "measure" else None
            if phase is not None:
                segments[int(phase)].append([])
            continue
        if phase is not None and rec["bs"] == int(phase):
            segments[int(phase)][-1].append(rec)
    out: dict[str, Any] = {}
    for bs, segs in segments.items():
        pairs = [pair for seg in segs for pair in list(itertools.pairwise(seg))[skip:]]
        steps = [b["host_start"] - a["host_start"] for a, b in pairs]
        # the step cut in three: the round's entry to the end of its wait (host_ms), the timer's own work after
        # the wait (timer_ms), the scheduler's work up to the next round's entry (sched_ms)
        sched = [b["host_start"] - a["host_exit"] for a, b in pairs if "host_exit" in a]
        recs = [rec for seg in segs for rec in seg[skip:]]
        if not recs:
            out[str(bs)] = {"rounds": 0}
            continue
        row: dict[str, Any] = {"rounds": len(recs)}
        for key in ("draft_ms", "build_ms", "verify_ms", "commit_ms", "round_ms", "host_ms", "head_ms", "plan_ms",
                    "mask_ms", "prep_ms", "fwd_ms", "replay_host_ms"):  # fmt: skip
            vals = [r[key] for r in recs if r.get(key) is not None]
            if vals:
                row[key] = statistics.median(vals)
        if steps:
            row["step_ms"] = statistics.median(steps) * 1e3
        if sched:
            row["sched_ms"] = statistics.median(sched) * 1e3
            row["timer_ms"] = (
                statistics.median([r["host_exit"] - r["host_end"] for r in recs if "host_exit" in r]) * 1e3
            )
        toks = [r["tokens"] / r["bs"] for r in recs if r.get("tokens") is not None]
        row["tau"] = statistics.mean(toks) if toks else None
        row["cuda_graph"] = sum(1 for r in recs if r.get("cuda_graph")) / len(recs)
        out[str(bs)] = row
    return out


def launch(name: str, kwargs: dict[str, Any], env: dict[str, str], run_dir: Path, args: argparse.Namespace,
           timer: Path, vocab: int) -> subprocess.Popen[str]:  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("ready", "go", "result.json"):
        (run_dir / stale).unlink(missing_ok=True)
    timer.unlink(missing_ok=True)
    job = {
        "engine": kwargs,
        "batches": args.batches,
        "prefix": args.prefix,
        "vocab": vocab,
        "seed": 7,
        "timer": str(timer),
        "wait_s": args.timeout,
        "repeats": args.repeats,
        "sampling": {"temperature": args.temperature, "max_new_tokens": args.new_tokens, "ignore_eos": True},
        "fair": fair_count(args) if args.fair else 0,
        "fair_minimum": args.fair_minimum,
    }
    (run_dir / "job.json").write_text(json.dumps(job))
    log = (run_dir / "engine.log").open("w")
    print(f"  start {name}", flush=True)
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--engine", str(run_dir / "job.json"),
         str(run_dir / "result.json")],
        cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen[str], deadline: float) -> bool:
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", nargs=2, type=Path, help=argparse.SUPPRESS)
    p.add_argument("--models", default="dense,hybrid")
    p.add_argument("--modes", default="dflash,tree")
    p.add_argument("--graphs", default="on,off", help="comma list of on/off (CUDA graphs)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--prefix", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="measured batches per batch size (tables: medians)")
    p.add_argument("--skip", type=int, default=4, help="rounds skipped at the start of each batch")
    p.add_argument("--budget", type=int, default=15)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--parallel", type=int, default=1, help="Engines started at once (>1 races SGLang's profiling)")
    p.add_argument("--mem-fraction-dense", type=float, default=0.5)
    p.add_argument("--mem-fraction-hybrid", type=float, default=0.88)
    p.add_argument("--timeout", type=int, default=420, help="seconds an Engine may take to start or to run")
    p.add_argument("--cache", type=Path, default=TINY)
    p.add_argument("--json", type=Path, default=Path("cost.json"))
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/cost_logs"))
    p.add_argument("--only", default="", help="comma list of run names (e.g. hybrid-tree-eager); default all")
    p.add_argument("--configs-only", action="store_true")
    p.add_argument("--report", nargs="+", type=Path, help="print the comparison tables of these JSON files")
    p.add_argument("--policy-report", nargs="+", type=Path, help="print dflash / tree / tree-policy tok/s tables")
    p.add_argument("--replay", type=Path, help="tree modes: DDTREE_REPLAY_ACCEPTANCE (a recorded paths file)")
    p.add_argument("--replay-report", nargs="+", type=Path, help="print issue 45's replayed-acceptance table")
    p.add_argument("--dflash-tau", type=float, default=2.11, help="--replay-report: DFLASH's tau on the real pair")
    p.add_argument("--replay-dflash", type=Path, help="dflash modes: DDTREE_DFLASH_REPLAY (a ddtree-accepts/1 file)")
    p.add_argument("--fair", action="store_true", help="every batch size replays the same recorded requests")
    p.add_argument("--fair-minimum", type=int, default=16, help="--fair: requests per batch size at least")
    p.add_argument("--fair-report", nargs="+", type=Path, help="print the fair replay's table (with the recordings)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the measured requests")
    p.add_argument("--old-runtime", type=Path, help="mode tree-old: this runtime directory first on PYTHONPATH")
    p.add_argument("--loop-profile", action="store_true", help="cProfile the scheduler outside the rounds")
    args = p.parse_args(argv)
    if args.engine:
        engine_child(*args.engine)
        return 0
    if args.report:
        print(report_tables([json.loads(path.read_text()) for path in args.report]))
        return 0
    if args.policy_report:
        print(policy_table([json.loads(path.read_text()) for path in args.policy_report]))
        return 0
    if args.replay_report:
        print(replay_table([json.loads(path.read_text()) for path in args.replay_report], args.dflash_tau))
        return 0
    if args.fair_report:
        print(fair_table([json.loads(path.read_text()) for path in args.fair_report], args))
        return 0
    if args.fair and (args.replay is None or args.replay_dflash is None):
        raise SystemExit("--fair needs both recordings: --replay (the tree's paths) and --replay-dflash (DFLASH's)")
    args.batches = [int(x) for x in args.batches.split(",")]
    configs = write_configs(args.cache / "real_shapes")
    if args.configs_only:
        print(f"configs in {args.cache / 'real_shapes'}")
        return 0

    started = time.monotonic()
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
    for model in args.models.split(","):
        specs = []
        for mode in args.modes.split(","):
            for g in args.graphs.split(","):
                graphs = g == "on"
                name = f"{model}-{mode}-{'graph' if graphs else 'eager'}"
                if args.only and name not in args.only.split(","):
                    continue
                specs.append((name, mode, graphs))
        parallel = args.parallel if model == "dense" else 1
        vocab = MODELS[model][0]["vocab_size"]
        pending = list(specs)
        while pending:
            group, pending = pending[:parallel], pending[parallel:]
            procs = {}
            for name, mode, graphs in group:
                run_dir = args.log_dir / name
                timer = run_dir / "rounds.jsonl"
                kwargs = engine_kwargs(configs[model], model, mode, graphs, args)
                procs[name] = (launch(name, kwargs, run_env(model, mode, args, timer), run_dir, args, timer, vocab),
                               run_dir, timer)  # fmt: skip
            for name, (proc, run_dir, timer) in procs.items():  # measured one at a time
                deadline = time.monotonic() + args.timeout
                entry: dict[str, Any] = {}
                if wait_for(run_dir / "ready", proc, deadline):
                    entry["startup_s"] = float((run_dir / "ready").read_text())
                    (run_dir / "go").write_text("")
                    try:
                        proc.wait(timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, 9)
                        entry["error"] = "timed out measuring"
                else:
                    entry["error"] = "did not start"
                result = run_dir / "result.json"
                if result.is_file():
                    entry["result"] = json.loads(result.read_text())
                    entry["rounds"] = summarize(timer, args.batches, args.skip)
                    entry["loop"] = summarize_loop(timer.with_name("loop.jsonl"), args.batches, args.skip)
                    if mode_of(name) in ("tree-policy", "tree-chain"):
                        log = (run_dir / "engine.log").read_text(errors="replace")
                        entry["policy_choice"] = policy_choice(log)
                else:
                    entry.setdefault("error", f"exit {proc.poll()}")
                    log = (run_dir / "engine.log").read_text(errors="replace")
                    entry["log_tail"] = log[-4000:]
                    try:
                        os.killpg(proc.pid, 9)
                    except ProcessLookupError:
                        pass
                report["runs"][name] = entry
                status = entry.get("error", "ok")
                print(f"  {name}: {status} ({time.monotonic() - started:.0f} s)", flush=True)
                args.json.write_text(json.dumps(report, indent=1))
    report["wall_s"] = time.monotonic() - started
    args.json.write_text(json.dumps(report, indent=1))
    print_tables(report, args)
    return 0 if all("error" not in r for r in report["runs"].values()) else 1


def print_tables(report: dict[str, Any], args: argparse.Namespace) -> None:
    keys = ("draft_ms", "fwd_ms", "build_ms", "verify_ms", "commit_ms", "round_ms", "step_ms", "host_ms", "timer_ms",
            "sched_ms", "head_ms", "plan_ms", "mask_ms", "prep_ms")  # fmt: skip
    print("| run | bs | draft | (fwd) | build | verify | commit | round | step | host | timer | sched | head | plan | "
          "mask | prep | tau | graph |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, entry in report["runs"].items():
        for bs, row in (entry.get("rounds") or {}).items():
            cells = [f"{row[k]:.2f}" if k in row else "-" for k in keys]
            tau = f"{row['tau']:.2f}" if row.get("tau") else "-"
            print(f"| {name} | {bs} | " + " | ".join(cells) + f" | {tau} | {row.get('cuda_graph', 0):.2f} |")
    print("| run | bs | ingest | next | round (host) | run | process | loop | between |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, entry in report["runs"].items():
        for bs, row in (entry.get("loop") or {}).items():
            cells = [f"{row[k]:.3f}" for k in (*LOOP_PHASES, "between")]
            print(f"| {name} | {bs} | " + " | ".join(cells) + " |")
    for bs in map(str, args.batches):  # the same prompts in every Engine: greedy tokens must agree
        digests = {
            name: b["output_ids_sha256"]
            for name, entry in report["runs"].items()
            for b in (entry.get("result") or {}).get("batches", [])
            if str(b["bs"]) == bs
        }
        print(f"# bs {bs}: tokens equal across {', '.join(digests)}: {len(set(digests.values())) == 1}")
    for name, entry in report["runs"].items():
        if "error" in entry or "skipped" in entry:
            print(f"# {name}: {entry.get('error') or entry.get('skipped')}")


def report_tables(reports: list[dict[str, Any]]) -> str:
    """DDTREE vs DFLASH per model and batch size (round, step, their ratios), and tok/s per request for the DDTree
    paper's tau values (Qwen3-8B, temperature 0), from cost_bench JSON files."""
    runs = {name: entry for rep in reports for name, entry in rep["runs"].items() if entry.get("rounds")}
    out = [
        "| model | bs | DFLASH | DDTREE | DFLASH round | DDTREE round | ratio | DFLASH step | DDTREE step | ratio |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    pairs = []
    for model in ("dense", "hybrid"):
        for dname, tname in ((f"{model}-dflash-graph", f"{model}-tree-graph"),
                             (f"{model}-dflash-graph", f"{model}-tree-eager"),
                             (f"{model}-dflash-eager", f"{model}-tree-eager")):  # fmt: skip
            if dname in runs and tname in runs:
                pairs.append((model, dname, tname))
    for model, dname, tname in pairs:
        for bs, d in runs[dname]["rounds"].items():
            t = runs[tname]["rounds"].get(bs)
            if not t or "round_ms" not in d or "round_ms" not in t:
                continue
            out.append(
                f"| {model} | {bs} | {dname.split('-')[-1]} | {tname.split('-')[-1]} | {d['round_ms']:.2f} | "
                f"{t['round_ms']:.2f} | {t['round_ms'] / d['round_ms']:.3f} | {d['step_ms']:.2f} | "
                f"{t['step_ms']:.2f} | {t['step_ms'] / d['step_ms']:.3f} |"
            )
    out += ["", "tok/s per request = tau / step (DDTree paper's tau, Qwen3-8B, T=0; its DDTree tau is at the best "
            "budget of 16..1024, above this run's 15):", ""]  # fmt: skip
    head = " | ".join(f"{k} {a:g} / {b:g}" for k, (a, b) in PAPER_TAU.items())
    out += [f"| model | bs | pair | {head} |", "|---|---:|---|" + "---:|" * len(PAPER_TAU)]
    for model, dname, tname in pairs:
        for bs, d in runs[dname]["rounds"].items():
            t = runs[tname]["rounds"].get(bs)
            if not t or "step_ms" not in d or "step_ms" not in t:
                continue
            cells = [f"{1e3 * a / d['step_ms']:.0f} / {1e3 * b / t['step_ms']:.0f}" for a, b in PAPER_TAU.values()]
            pair = f"{dname.split('-')[-1]} / {tname.split('-')[-1]}"
            out.append(f"| {model} | {bs} | {pair} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
