"""Host time between decode rounds, DFLASH vs DDTREE tree, in SGLang's real Engine on the CPU (no GPU needed):
the tiny dense pair (tests/runtime/conftest.py's `tiny_dense`, built by `python -m ddtree.tiny`) served by the CPU
engine test's driver (tests/runtime/sglang_engine/driver.py, its patches), with `standin/loop_timer.py` timing
each phase of the scheduler loop (and, with --profile, a cProfile of everything outside the worker's round).

    PYTHONPATH=runtime python dev/sglang_gpu/host_profile.py --models .cache/tiny/qwen3 --batches 1,8 --out /tmp/hp

Per mode and batch size: medians of ingest / next / round / run / process / loop (ms) over the decode
iterations; `loop - round` is the host time a round does not account for. On a CPU the round is the whole
forward (interpreted Triton kernels), so only the phases outside it compare with a GPU host.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO / "tests" / "runtime" / "sglang_engine"
HOSTPROF_DIR = Path(__file__).resolve().parent / "cpu_hostprof"
PHASES = ("ingest", "next", "round", "run", "process", "loop")


def engine_kwargs(models: Path, mode: str, bs: int) -> dict[str, Any]:
    """tests/runtime/test_sglang_engine.py's CPU settings, DFLASH or DDTREE."""
    return {
        "model_path": str(models / "target"),
        "device": "cpu",
        "dtype": "float32",
        "attention_backend": "triton",
        "triton_attention_num_kv_splits": 1,
        "page_size": 1,
        "disable_overlap_schedule": True,
        "disable_cuda_graph": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "mem_fraction_static": 0.05,
        "max_total_tokens": 8192,
        "max_running_requests": bs,
        "skip_server_warmup": True,
        "skip_tokenizer_init": True,
        "random_seed": 0,
        "log_level": "warning",
        "speculative_algorithm": "DFLASH" if mode == "dflash" else "DDTREE",
        "speculative_draft_model_path": str(models / "draft"),
    }


def run_mode(models: Path, mode: str, bs: int, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = args.out / f"{mode}-{bs}"
    run_dir.mkdir(parents=True, exist_ok=True)
    loop_file = run_dir / "loop.jsonl"
    loop_file.unlink(missing_ok=True)
    rng = random.Random(7)
    vocab = json.loads((models / "target" / "config.json").read_text())["vocab_size"]
    prompts = [[rng.randrange(vocab) for _ in range(args.prefix)] for _ in range(bs)]
    job = {"engine": engine_kwargs(models, mode, bs), "batches": [prompts], "max_new_tokens": args.new_tokens}
    (run_dir / "job.json").write_text(json.dumps(job))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOSTPROF_DIR), str(ENGINE_DIR), str(REPO / "runtime")]),
        "SGLANG_USE_CPU_ENGINE": "1",
        "TRITON_INTERPRET": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "DDTREE_LOOP_TIMER": str(loop_file),
    }
    if args.profile:
        env["DDTREE_LOOP_PROFILE"] = str(run_dir / "loop.prof")
    if mode == "tree":
        env.update(DDTREE_VERIFY="tree", DDTREE_BUDGET=str(args.budget), DDTREE_TOPK=str(args.topk))
        env.update(DDTREE_LOG_INTERVAL="1000", DDTREE_ALLOW_HYBRID_UNSAFE="0")
    with (run_dir / "engine.log").open("w") as log:
        done = subprocess.run(
            [sys.executable, str(ENGINE_DIR / "driver.py"), str(run_dir / "job.json"), str(run_dir / "result.json")],
            env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{mode} bs {bs}: exit {done.returncode}, see {run_dir / 'engine.log'}")
    result = json.loads((run_dir / "result.json").read_text())
    lines = [json.loads(x) for x in loop_file.read_text().splitlines() if x.strip()]
    lines = [r for r in lines if r["bs"] == bs][args.skip :]
    summary: dict[str, Any] = {"iterations": len(lines)}
    for phase in PHASES:
        vals = [r.get(phase, 0.0) for r in lines]
        if vals:
            summary[phase] = statistics.median(vals)
    summary["between"] = statistics.median([r["loop"] - r.get("round", 0.0) for r in lines]) if lines else None
    summary["outputs"] = [out["output_ids"] for out in result["batches"][0]]
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=REPO / ".cache" / "tiny" / "qwen3")
    p.add_argument("--modes", default="dflash,tree")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prefix", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--budget", type=int, default=7)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--skip", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--out", type=Path, default=Path("/tmp/host_profile"))
    args = p.parse_args()
    report: dict[str, Any] = {}
    for bs in [int(x) for x in args.batches.split(",")]:
        for mode in args.modes.split(","):
            summary = run_mode(args.models, mode, bs, args)
            report[f"{mode}-{bs}"] = summary
            cells = " ".join(f"{k} {summary[k]:.3f}" for k in (*PHASES, "between") if summary.get(k) is not None)
            print(f"{mode:6} bs {bs:2}: {summary['iterations']} iterations, ms: {cells}", flush=True)
        outs = {mode: report[f"{mode}-{bs}"]["outputs"] for mode in args.modes.split(",")}
        print(f"bs {bs}: outputs equal across modes: {len({json.dumps(o) for o in outs.values()}) == 1}")
    (args.out / "host_profile.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
