"""Run SGLang's real Engine once and write its greedy outputs as JSON (docs/ci.md, "SGLang's engine on CPU,
in CI").

    python driver.py JOB.json RESULT.json
    python driver.py --serve

JOB: {"engine": {ServerArgs keyword arguments}, "batches": [[input_ids, ...], ...], "max_new_tokens": N,
"overrides": {"<batch index>": [{sampling params of request i}, ...]}, "top_logprobs": K} ("overrides" optional;
"top_logprobs", optional: every request returns its output log-probs and its top K, SGLang's return_logprob;
"refusals", optional: [{sampling params}, ...], each sent alone with the first batch's first prompt before the
batches, its ValueError (what SGLang's HTTP server answers with a 400) or its output kept in order).
Each batch is one `Engine.generate` call (several requests in one call run batched in the scheduler), greedy,
`ignore_eos`, unless overridden per request. RESULT: {"startup_s", "generate_s", "batch_s": [seconds of each
generate call], "batches": [[{"prompt_ids", "output_ids", "meta_info"}, ...], ...]}; with `enable_metrics` in
"engine", also "metrics": the `ddtree_*` part of what SGLang's `/metrics` serves after the last batch (Prometheus
text, read from the multiprocess directory the way the HTTP server's `/metrics` reads it).

`--serve` is the engine host the tests share (tests/runtime/sglang_host.py): it imports SGLang and the modules its
scheduler and detokenizer need once, then reads one request per stdin line, {"job", "result", "log", "env"}, and
runs each job in a child forked from it (its own session, its stdout and stderr into "log", "env" added to its
environment), SGLang's own processes forked from that child instead of spawned: no process re-imports SGLang
(about 50 s of every Engine launch on a loaded 2-core machine). It answers {"pid": N} when a child starts and
{"rc": N} when it ends, one line each.

Started by the runtime tests (tests/runtime/sglang_host.py) with this directory on PYTHONPATH, so sitecustomize.py
has already installed the torchvision stub and the SGLang patches here (and so in every process forked from here,
or spawned by a one-job driver).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang

    started = time.monotonic()
    engine = sglang.Engine(**job["engine"])
    startup_s = time.monotonic() - started
    params = {"temperature": 0.0, "max_new_tokens": job["max_new_tokens"], "ignore_eos": True}
    batches: list[list[dict[str, Any]]] = []
    batch_s: list[float] = []
    metrics: str | None = None
    refusals: list[dict[str, Any]] = []
    try:
        for refused in job.get("refusals", []):
            try:
                out = engine.generate(input_ids=job["batches"][0][0], sampling_params={**params, **refused})
                refusals.append({"output_ids": out["output_ids"]})
            except ValueError as exc:
                refusals.append({"error": str(exc)})
        started = time.monotonic()
        for index, batch in enumerate(job["batches"]):
            batch_started = time.monotonic()
            overrides = job.get("overrides", {}).get(str(index))
            sampling: Any = [{**params, **o} for o in overrides] if overrides else params
            logprobs: dict[str, Any] = {}
            if job.get("top_logprobs") is not None:
                logprobs = {"return_logprob": True, "top_logprobs_num": int(job["top_logprobs"])}
            outs = engine.generate(input_ids=batch, sampling_params=sampling, **logprobs)
            batches.append(
                [
                    {"prompt_ids": prompt, "output_ids": out["output_ids"], "meta_info": out["meta_info"]}
                    for prompt, out in zip(batch, outs, strict=True)
                ]
            )
            batch_s.append(time.monotonic() - batch_started)
        generate_s = time.monotonic() - started
        if job["engine"].get("enable_metrics"):
            metrics = ddtree_metrics_text()
    finally:
        engine.shutdown()
    result = {"startup_s": startup_s, "generate_s": generate_s, "batch_s": batch_s, "batches": batches}
    if job.get("refusals"):
        result["refusals"] = refusals
    return result if metrics is None else {**result, "metrics": metrics}


def ddtree_metrics_text() -> str:
    """The `ddtree_*` families of what `/metrics` would serve now: SGLang's HTTP server collects the
    PROMETHEUS_MULTIPROC_DIR that `--enable-metrics` set up (sglang.srt.utils.add_prometheus_middleware), in
    this process, with prometheus_client's MultiProcessCollector; the same here, without the HTTP server."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    text = generate_latest(registry).decode()
    families = text.split("# HELP ")
    return "".join("# HELP " + f for f in families[1:] if f.startswith("ddtree_"))


def run_to_file(job_path: str, result_path: str) -> None:
    result = run(json.loads(Path(job_path).read_text()))
    Path(result_path).write_text(json.dumps(result, default=str))


# What SGLang's scheduler and detokenizer import at start (the model registry imports every model module),
# imported once in the host so that forked children find them loaded.
PRELOAD = [
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.speculative.dflash_worker_v2",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.models.qwen3",
    "sglang.srt.models.qwen3_5",
]


def fork_instead_of_spawn() -> None:
    """SGLang sets the start method to spawn (CUDA cannot be forked); on a CPU a fork keeps the imports."""
    from sglang.srt.entrypoints import engine

    original = engine._set_envs_and_config

    def set_envs_and_config(server_args: Any) -> None:
        original(server_args)
        multiprocessing.set_start_method("fork", force=True)

    engine._set_envs_and_config = set_envs_and_config


def run_child(request: dict[str, Any]) -> int:
    """In the forked child: its own session (a timeout kills its process group), its own log, its env."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.update(request.get("env", {}))
    try:
        run_to_file(request["job"], request["result"])
        return 0
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve() -> None:
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            importlib.import_module(name)
    fork_instead_of_spawn()
    # SGLang's modules (millions of objects) never become garbage: out of every forked run's collector passes
    gc.freeze()
    reply = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(run_child(request))
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        run_to_file(*sys.argv[1:3])


if __name__ == "__main__":
    main()
