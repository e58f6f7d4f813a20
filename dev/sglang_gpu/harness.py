"""GPU harness: SGLang 0.5.23's real Engine on CUDA with baseline, DFLASH and DDTREE (shadow, tree)
on the tiny dense (float32) and hybrid (bfloat16) pairs, compared token for token with each other and with
transformers' float32 greedy decode on the CPU.

Run through dev/sglang_gpu/run.sh (it installs SGLang's wheels and the runtime, sets PYTHONPATH and the env),
or, where SGLang and its real sgl_kernel are installed, directly: `python dev/sglang_gpu/harness.py --help`.

Per model:
1. the tiny pair with head_dim 32 (SGLang's GPU kernels need power-of-two head dims), from `--cache` or built
   there (`ddtree.tiny.build`, ~2-3 min per pair on one CPU thread);
2. transformers' float32 greedy continuation of every prompt on the CPU, with each position's top-2 logit gap
   and runner-up token (EOS unmasked: SGLang's `ignore_eos` emits EOS when it is the argmax), cached in `--cache`;
3. one SGLang Engine launch per mode, each in its own subprocess (tests/runtime/sglang_engine/driver.py, through
   engine_driver.py), several at once (`--parallel`), each batch one `Engine.generate` call: the 6 prompts
   batched, then the first alone, then (`--extra-prompts 20`) 20 more batched;
4. a table per model: for each mode and request, equal to SGLang's baseline?, to DFLASH?, the first token that
   differs from the baseline, the acceptance length, and the comparison with transformers, margin-aware: `tie@i`
   when the first difference is at a position whose reference top-2 gap is below `--tie-margin` and SGLang chose
   the reference's runner-up, else `DIFF@i`.

The JSON (`--json`) holds every request's tokens and verdicts, each run's DDTREE init / metrics lines (parsed)
and log tail; full logs go to `--log-dir`. Exit status: 1 if a DDTREE tree run differs from SGLang's baseline on
any request (or a run failed), else 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRIVER = HERE / "engine_driver.py"

# From the tiny corpus's domain (runtime/ddtree/tiny/corpus.py): held-out style tasks, and two the drafter
# knows less well (so trees accept off their spine).
PROMPTS = (
    "count from 43 to 50",
    "json for dave, age 47, from delhi",
    "write mul for 4 and 9",
    "tell me a story about a dog",
    "json for bob, age 31, from paris, with a list of 5 pets",
    "list 4 fruits and spell lemon",
)
EXTRA_SEED = 4242
MODELS = {"dense": ("qwen3", "float32"), "hybrid": ("qwen3_5", "bfloat16")}
MODES = ("baseline", "dflash", "shadow", "tree")
METRICS = re.compile(r"DDTREE metrics ((?:\w+=\S+ ?)+)")
INIT = re.compile(r"DDTREE init .*")
LOG_TAIL = 6000
REFERENCE_VERSION = 1


# ---------------------------------------------------------------- models and reference (CPU, no SGLang)


def ensure_pair(cache: Path, model: str, threads: int) -> Path:
    """cache/<model> holding target/, draft/, build.json (head_dim 32); built (subprocess, atomic rename) if
    missing."""
    out = cache / model
    if (out / "build.json").is_file():
        return out
    arch, _ = MODELS[model]
    partial = cache / f".{model}.partial-{os.getpid()}"
    code = (
        "import sys, torch; from pathlib import Path\n"
        f"torch.set_num_threads({threads})\n"
        "from ddtree.tiny import Arch, BuildSettings, build\n"
        "from ddtree.tiny.target import TargetShape\n"
        f"build(Arch({arch!r}), Path({str(partial)!r}), "
        "settings=BuildSettings(target_shape=TargetShape(head_dim=32)))\n"
    )
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tiny {model} build failed ({done.returncode}):\n{done.stderr[-4000:]}")
    partial.rename(out)
    print(f"built tiny {model} pair in {time.monotonic() - started:.0f}s -> {out}", flush=True)
    return out


def prompt_texts(extra: int) -> list[str]:
    from ddtree.tiny import corpus

    return list(PROMPTS) + corpus.heldout_prompts(extra, EXTRA_SEED, set(PROMPTS)) if extra else list(PROMPTS)


@dataclass
class Reference:
    """transformers' float32 greedy continuation of one prompt; gaps[i] = top1 - top2 logit at step i."""

    prompt_ids: list[int]
    tokens: list[int]
    gaps: list[float]
    runner_up: list[int]


def greedy_reference(pair: Path, texts: list[str], new_tokens: int) -> list[Reference]:
    """A plain argmax loop (full forward per step, float32, CPU, one thread): no generate() logits processors,
    EOS unmasked."""
    import torch
    from ddtree.tiny import chat_prompt_ids
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # a tiny model: more threads only spin on each other (measured 50x slower at 2 of 2)
    tok = AutoTokenizer.from_pretrained(pair / "target")
    model = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    refs = []
    for text in texts:
        ids = chat_prompt_ids(tok, text, thinking=False)
        seq, gaps, runner_up = list(ids), [], []
        with torch.no_grad():
            for _ in range(new_tokens):
                logits = model(torch.tensor([seq])).logits[0, -1].float()  # [V]
                top = torch.topk(logits, 2)
                seq.append(int(top.indices[0]))
                gaps.append(float(top.values[0] - top.values[1]))
                runner_up.append(int(top.indices[1]))
        refs.append(Reference(ids, seq[len(ids) :], gaps, runner_up))
    return refs


def cached_reference(cache: Path, model: str, pair: Path, texts: list[str], new_tokens: int) -> list[Reference]:
    """greedy_reference per prompt, cached in cache/reference-<model>.json (keyed by prompt and length; dropped
    when the pair is rebuilt)."""
    path = cache / f"reference-{model}.json"
    build = json.loads((pair / "build.json").read_text()).get("seconds")
    stored: dict[str, Any] = {}
    if path.is_file():
        loaded = json.loads(path.read_text())
        if loaded.get("version") == REFERENCE_VERSION and loaded.get("build") == build:
            stored = loaded["refs"]
    missing = [t for t in texts if f"{new_tokens}:{t}" not in stored]
    if missing:
        import transformers

        started = time.monotonic()
        for text, ref in zip(missing, greedy_reference(pair, missing, new_tokens), strict=True):
            stored[f"{new_tokens}:{text}"] = {**asdict(ref), "transformers": transformers.__version__}
        path.write_text(json.dumps({"version": REFERENCE_VERSION, "build": build, "refs": stored}))
        print(f"transformers reference ({model}, {len(missing)} prompts): {time.monotonic() - started:.0f}s")
    fields = set(Reference.__dataclass_fields__)
    return [Reference(**{k: v for k, v in stored[f"{new_tokens}:{t}"].items() if k in fields}) for t in texts]


# ---------------------------------------------------------------- engine runs (subprocesses)


@dataclass(frozen=True)
class RunSpec:
    model: str
    mode: str
    engine: dict[str, Any]
    env: dict[str, str]
    batches: list[list[list[int]]]
    batch_names: list[str]
    new_tokens: int
    # per batch index (as a string), each request's sampling parameters over the driver's greedy defaults
    overrides: dict[str, list[dict[str, Any]]] | None = None
    top_logprobs: int | None = None  # every request returns its log-probs and its top K (return_logprob)


def hybrid_override(target: Path) -> dict[str, Any]:
    """SGLang derives a Qwen3.5 target's layer types from `full_attention_interval`
    (`sglang/srt/configs/qwen3_next.py:264`), which the tiny config (transformers' `layer_types`) lacks: pass it,
    checked against the layer types. (The same derivation as hybrid_overrides in
    tests/runtime/test_sglang_engine.py; not imported from there, a pytest module.)"""
    layer_types = json.loads((target / "config.json").read_text())["layer_types"]
    interval = layer_types.index("full_attention") + 1
    derived = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(len(layer_types))]
    if derived != layer_types:
        raise ValueError(f"layer types not periodic: {layer_types}")
    return {"json_model_override_args": json.dumps({"full_attention_interval": interval})}


def engine_kwargs(pair: Path, dtype: str, args: argparse.Namespace, max_batch: int, port: int) -> dict[str, Any]:
    """What opsctl renders for an sglang service (triton attention, page 1, no overlap), on CUDA, radix off."""
    kwargs: dict[str, Any] = {
        "model_path": str(pair / "target"),
        "device": "cuda",
        "dtype": dtype,
        "attention_backend": "triton",
        "sampling_backend": "pytorch",  # flashinfer's samplers are absent; greedy never samples anyway
        "page_size": 1,
        "disable_overlap_schedule": True,
        "disable_cuda_graph": not args.cuda_graph,
        "disable_radix_cache": True,
        "mem_fraction_static": args.mem_fraction,
        "max_total_tokens": 16384,
        "max_running_requests": max(8, max_batch),
        "skip_server_warmup": True,
        "random_seed": 0,
        "log_level": "info",
        "port": port,
        "nccl_port": port + 1,  # explicit: several Engines start at once
        "tp_size": args.tp,
    }
    if args.tp > 1:
        kwargs["disable_custom_all_reduce"] = True  # its kernels are sgl_kernel's, which the stand-in lacks
    if args.cuda_graph:
        # decode / verify graphs only (what DFLASH and DDTREE replay every round); prefill stays eager
        kwargs["cuda_graph_max_bs_decode"] = max(8, max_batch)
        kwargs["disable_prefill_cuda_graph"] = True
    return kwargs


def mode_spec(mode: str, pair: Path, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """(extra engine kwargs, env) of one mode."""
    if mode == "baseline":
        return {}, {}
    block = int(json.loads((pair / "draft" / "config.json").read_text())["block_size"])
    budget = args.tree_budget or block - 1
    draft = {"speculative_draft_model_path": str(pair / "draft")}
    common = {
        "DDTREE_BUDGET": str(budget),
        "DDTREE_TOPK": str(args.tree_topk),
        "DDTREE_LOG_INTERVAL": str(args.log_interval),
        "DDTREE_ALLOW_HYBRID_UNSAFE": "0",
    }
    if mode == "dflash":
        return {"speculative_algorithm": "DFLASH", **draft}, {}
    if mode == "shadow":
        env = {**common, "DDTREE_VERIFY": "shadow", "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "1"}
        return {"speculative_algorithm": "DDTREE", **draft}, env
    if mode == "tree":
        return {"speculative_algorithm": "DDTREE", **draft}, {**common, "DDTREE_VERIFY": "tree"}
    raise ValueError(mode)


def run_engine(spec: RunSpec, log_dir: Path, timeout_s: int) -> dict[str, Any]:
    """One Engine launch; returns {"ok", "result" | "error", "log_tail", "init", "metrics", "wall_s"}."""
    run_dir = log_dir / f"{spec.model}-{spec.mode}"
    run_dir.mkdir(parents=True, exist_ok=True)
    job, result = run_dir / "job.json", run_dir / "result.json"
    result.unlink(missing_ok=True)
    job_fields: dict[str, Any] = {"engine": spec.engine, "batches": spec.batches, "max_new_tokens": spec.new_tokens}
    if spec.overrides:
        job_fields["overrides"] = spec.overrides
    if spec.top_logprobs is not None:
        job_fields["top_logprobs"] = spec.top_logprobs
    job.write_text(json.dumps(job_fields))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **spec.env}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(job), str(result)],
        cwd=run_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends SGLang's children too
    )
    error = None
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        error = f"timed out after {timeout_s}s"
    wall = time.monotonic() - started
    (run_dir / "engine.log").write_text(log)
    if error is None and (proc.returncode != 0 or not result.is_file()):
        error = f"driver exited {proc.returncode}"
    out: dict[str, Any] = {
        "ok": error is None,
        "wall_s": round(wall, 1),
        "env": spec.env,
        "engine": spec.engine,
        "batch_names": spec.batch_names,
        "init": INIT.findall(log),
        "metrics": metrics_lines(log),
        "log": str(run_dir / "engine.log"),
        "log_tail": log[-LOG_TAIL:],
    }
    if error is None:
        out["result"] = json.loads(result.read_text())
    else:
        out["error"] = error
    status = "ok" if error is None else f"FAILED ({error})"
    print(f"  {spec.model}/{spec.mode}: {status}, {wall:.0f}s", flush=True)
    return out


def run_engines(
    specs: list[RunSpec], log_dir: Path, timeout_s: int, parallel: int
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every spec's `run_engine`, `parallel` at a time; results by (model, mode)."""
    print(f"launching {len(specs)} Engine runs, {parallel} at a time", flush=True)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(run_engine, s, log_dir, timeout_s): s for s in specs}
        for future in concurrent.futures.as_completed(futures):
            spec = futures[future]
            results[(spec.model, spec.mode)] = future.result()
    return results


def metrics_lines(log: str) -> list[dict[str, str]]:
    """`DDTREE metrics k=v ...` lines as dicts (values as logged)."""
    return [dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv) for m in METRICS.finditer(log)]


# ---------------------------------------------------------------- comparison (pure)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def versus_reference(tokens: list[int], ref: Reference, margin: float) -> dict[str, Any]:
    """`equal`, or the first difference classified: `tie` when the reference's top-2 gap there is below `margin`
    and SGLang took the reference's runner-up (a near-tie either side may round differently), else `diff`."""
    at = first_difference(tokens, ref.tokens)
    if at is None:
        return {"verdict": "equal"}
    if at >= len(ref.gaps) or at >= len(tokens):
        return {"verdict": "diff", "at": at, "why": "length"}
    gap = ref.gaps[at]
    tie = gap < margin and tokens[at] == ref.runner_up[at]
    return {"verdict": "tie" if tie else "diff", "at": at, "gap": round(gap, 4)}


def hf_label(v: dict[str, Any]) -> str:
    if v["verdict"] == "equal":
        return "equal"
    gap = f"({v['gap']:.3f})" if "gap" in v else ""
    return f"{v['verdict']}@{v['at']}{gap}"


def compare_model(
    runs: dict[str, dict[str, Any]], refs_by_batch: dict[str, list[Reference]], margin: float
) -> list[dict[str, Any]]:
    """One row per (mode, batch, request): equal to baseline / DFLASH (same batch), first difference from the
    baseline, acceptance length, verdict against transformers."""
    rows = []

    def outputs(mode: str, batch: str) -> list[list[int]] | None:
        run = runs.get(mode)
        if not run or not run["ok"]:
            return None
        index = run["batch_names"].index(batch)
        return [out["output_ids"] for out in run["result"]["batches"][index]]

    for mode, run in runs.items():
        if not run["ok"]:
            rows.append({"mode": mode, "batch": "-", "request": -1, "error": run.get("error")})
            continue
        for batch_name, batch in zip(run["batch_names"], run["result"]["batches"], strict=True):
            base, dflash = outputs("baseline", batch_name), outputs("dflash", batch_name)
            for i, out in enumerate(batch):
                tokens = out["output_ids"]
                accept = out["meta_info"].get("spec_accept_length")
                row: dict[str, Any] = {
                    "mode": mode,
                    "batch": batch_name,
                    "request": i,
                    "tokens": tokens,
                    "eq_baseline": None if base is None else tokens == base[i],
                    "eq_dflash": None if dflash is None else tokens == dflash[i],
                    "diverge_from_baseline": None if base is None else first_difference(tokens, base[i]),
                    "accept_length": None if accept is None else round(float(accept), 3),
                    "vs_transformers": versus_reference(tokens, refs_by_batch[batch_name][i], margin),
                }
                rows.append(row)
    return rows


def render_table(model: str, rows: list[dict[str, Any]]) -> str:
    def yn(v: bool | None) -> str:
        return "-" if v is None else ("yes" if v else "NO")

    lines = [f"== {model}", f"{'mode':9} {'batch':8} {'req':>3} {'=base':>5} {'=dflash':>7} {'div@':>4} "
             f"{'accept':>6}  transformers fp32"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"{r['mode']:9} RUN FAILED: {r['error']}")
            continue
        div = "-" if r["diverge_from_baseline"] is None else str(r["diverge_from_baseline"])
        acc = "-" if r["accept_length"] is None else f"{r['accept_length']:.2f}"
        lines.append(
            f"{r['mode']:9} {r['batch']:8} {r['request']:>3} {yn(r['eq_baseline']):>5} {yn(r['eq_dflash']):>7} "
            f"{div:>4} {acc:>6}  {hf_label(r['vs_transformers'])}"
        )
    return "\n".join(lines)


def summarize_metrics(run: dict[str, Any]) -> str:
    """The DDTREE metrics lines of a run, summed where they are counts (off_spine, rounds, tokens)."""
    lines = run.get("metrics") or []
    if not lines:
        return ""
    total: dict[str, float] = {}
    for fields in lines:
        for key in ("rounds", "tokens", "off_spine"):
            if key in fields:
                try:
                    total[key] = total.get(key, 0.0) + float(fields[key])
                except ValueError:
                    pass
    return f"{len(lines)} metrics lines, " + ", ".join(f"{k}={v:g}" for k, v in total.items())


def tree_mismatches(rows: list[dict[str, Any]]) -> int:
    return sum(1 for r in rows if r["mode"] == "tree" and ("error" in r or r["eq_baseline"] is False))


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="dense,hybrid", help="comma list of: dense (fp32), hybrid (bf16)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of: {', '.join(MODES)}")
    p.add_argument("--cache", type=Path, default=REPO / ".cache" / "sglang_gpu", help="tiny pairs + references")
    p.add_argument("--json", type=Path, default=Path("sglang_gpu.json"), help="write the full results here")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/sglang_gpu_logs"), help="one folder per run")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--extra-prompts", type=int, default=0, help="N more corpus prompts, one more batch")
    p.add_argument("--tree-topk", type=int, default=8)
    p.add_argument("--tree-budget", type=int, default=0, help="DDTREE_BUDGET (0: drafter block - 1)")
    p.add_argument("--log-interval", type=int, default=4, help="DDTREE_LOG_INTERVAL")
    p.add_argument("--cuda-graph", action="store_true", help="enable CUDA graphs (off by default)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per Engine (GPUs 0 .. tp - 1)")
    p.add_argument("--parallel", type=int, default=4, help="Engine launches at once on the GPU")
    p.add_argument("--port-base", type=int, default=31000, help="first Engine port (harness runs side by side)")
    p.add_argument("--mem-fraction", type=float, default=0.08, help="mem_fraction_static per Engine")
    p.add_argument("--timeout", type=int, default=420, help="seconds per Engine launch")
    p.add_argument("--tie-margin-fp32", type=float, default=0.05, help="top-2 logit gap below which fp32 may flip")
    p.add_argument("--tie-margin-bf16", type=float, default=0.5, help="same for bfloat16 runs")
    p.add_argument("--build-threads", type=int, default=1, help="torch threads per tiny build (1: reproducible)")
    p.add_argument("--prepare-only", action="store_true", help="build the pairs and references, launch nothing")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="no SGLang: fake every mode's output from the reference (tree with one flipped token) to exercise "
        "the comparison and the table",
    )
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r} (choose from {', '.join(MODELS)})")
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    return args


def fake_run(spec: RunSpec, refs_by_batch: dict[str, list[Reference]]) -> dict[str, Any]:
    """--dry-run: the reference's tokens as this mode's output; tree's second request gets one token flipped."""
    batches = []
    for name in spec.batch_names:
        outs = []
        for i, ref in enumerate(refs_by_batch[name]):
            tokens = list(ref.tokens)
            if spec.mode == "tree" and i == 1 and len(tokens) > 3:
                tokens[3] = ref.runner_up[3]
            accept = None if spec.mode == "baseline" else 2.0
            outs.append({"output_ids": tokens, "meta_info": {"spec_accept_length": accept}})
        batches.append(outs)
    return {
        "ok": True, "wall_s": 0.0, "env": spec.env, "engine": spec.engine, "batch_names": spec.batch_names,
        "init": [], "metrics": [], "log": "", "log_tail": "", "result": {"batches": batches},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    texts = prompt_texts(args.extra_prompts)
    pairs = {m: ensure_pair(args.cache, m, args.build_threads) for m in args.models}
    refs = {m: cached_reference(args.cache, m, pairs[m], texts, args.new_tokens) for m in args.models}
    if args.prepare_only:
        print(f"prepared {', '.join(args.models)} in {args.cache}")
        return 0

    n = len(PROMPTS)
    specs: list[RunSpec] = []
    refs_by_model: dict[str, dict[str, list[Reference]]] = {}
    for mi, model in enumerate(args.models):
        _, dtype = MODELS[model]
        ids = [r.prompt_ids for r in refs[model]]
        batches, names = [ids[:n], ids[:1]], ["batched", "alone"]
        by_batch = {"batched": refs[model][:n], "alone": refs[model][:1]}
        if args.extra_prompts:
            batches.append(ids[n:])
            names.append("extra")
            by_batch["extra"] = refs[model][n:]
        refs_by_model[model] = by_batch
        extra: dict[str, Any] = {}
        if model == "hybrid":
            # a fixed Mamba state pool: auto-sizing from free memory would race the other Engines starting at once
            extra = {**hybrid_override(pairs[model] / "target"), "max_mamba_cache_size": 256}
        for si, mode in enumerate(args.modes):
            port = args.port_base + 200 * (mi * len(MODES) + si)
            base = engine_kwargs(pairs[model], dtype, args, max(len(b) for b in batches), port)
            mode_engine, env = mode_spec(mode, pairs[model], args)
            specs.append(RunSpec(model, mode, {**base, **extra, **mode_engine}, env, batches, names, args.new_tokens))

    started = time.monotonic()
    results: dict[tuple[str, str], dict[str, Any]] = {}
    if args.dry_run:
        for spec in specs:
            results[(spec.model, spec.mode)] = fake_run(spec, refs_by_model[spec.model])
    else:
        results = run_engines(specs, args.log_dir, args.timeout, args.parallel)

    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "prompts": texts, "models": {}}
    failures = 0
    for model in args.models:
        margin = args.tie_margin_fp32 if MODELS[model][1] == "float32" else args.tie_margin_bf16
        runs = {mode: results[(model, mode)] for mode in args.modes}
        rows = compare_model(runs, refs_by_model[model], margin)
        print()
        print(render_table(model, rows))
        for mode, run in runs.items():
            for line in run["init"][:1]:
                print(f"  {mode}: {line}")
            summary = summarize_metrics(run)
            if summary:
                print(f"  {mode}: {summary}")
        failures += tree_mismatches(rows)
        failures += sum(1 for run in runs.values() if not run["ok"])
        report["models"][model] = {
            "pair": str(pairs[model]),
            "build": json.loads((pairs[model] / "build.json").read_text()),
            "tie_margin": margin,
            "reference": [asdict(r) for r in refs[model]],
            "rows": rows,
            "runs": runs,
        }
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["failures"] = failures
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str))
    print(f"\n{failures} failure(s) (tree != baseline, or a run failed); JSON: {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
