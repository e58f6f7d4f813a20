"""Host time of each phase of SGLang's non-overlap scheduler loop (`Scheduler.event_loop_normal`), per decode
iteration: where a speculative worker's time between rounds goes. Off unless `DDTREE_LOOP_TIMER=<file>` is set;
then `patch_scheduler` wraps the Scheduler's methods when `sglang.srt.managers.scheduler` is imported (gpu_patches
on the GPU, dev/sglang_gpu/cpu_hostprof on the CPU engine).

One JSON line per iteration that ran a decode batch, in ms of host time (`time.perf_counter`):
- ingest:  `ingest_requests` (requests from the tokenizer);
- next:    `get_next_batch_to_run` (the decode batch's KV reservation, `prepare_for_decode`);
- round:   the speculative worker's `forward_batch_generation` (the round; on a GPU it ends before the GPU does,
  unless the round reads a result to the host);
- run:     the rest of `run_batch` (the scheduler's own work around the round);
- process: `process_batch_result` (the tokens to the host, per-request bookkeeping, the output to the detokenizer);
- loop:    from this iteration's `ingest_requests` to the next one's.

With `DDTREE_LOOP_PROFILE=<file>` too, a cProfile of the decode iterations outside the round (the worker's round is
excluded) is written to `<file>` every 20 decode iterations (pstats format; `python -m pstats <file>`).
"""

from __future__ import annotations

import cProfile
import json
import os
import time
from collections.abc import Callable
from typing import Any

ENV = "DDTREE_LOOP_TIMER"
PROFILE_ENV = "DDTREE_LOOP_PROFILE"


class _LoopTimer:
    """The current iteration's phase times, one line per decode iteration."""

    def __init__(self, path: str, profile_path: str | None) -> None:
        self.sink = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the scheduler process
        self.phases: dict[str, float] = {}
        self.loop_start: float | None = None
        self.decode: dict[str, Any] | None = None  # the last iteration's decode batch: mode, bs
        self.profile_path = profile_path
        self.profiler = cProfile.Profile() if profile_path else None
        self.profiled = 0
        self.decoding = False  # the last iteration ran a decode batch: profile this one outside the round

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds * 1e3

    def profile(self, on: bool) -> None:
        if self.profiler is None:
            return
        if on and self.decoding:
            self.profiler.enable()
        elif not on:
            self.profiler.disable()

    def iteration_start(self) -> None:
        now = time.perf_counter()
        if self.loop_start is not None and self.decode is not None:
            record = {**self.decode, **{k: round(v, 4) for k, v in self.phases.items()}}
            record["loop"] = round((now - self.loop_start) * 1e3, 4)
            self.sink.write(json.dumps(record) + "\n")
            self.profiled += 1
            if self.profiler is not None and self.profiled % 20 == 0:
                self.profiler.dump_stats(str(self.profile_path))
        self.decoding = self.decode is not None
        self.loop_start, self.phases, self.decode = now, {}, None


def _timed(timer: _LoopTimer, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.add(phase, time.perf_counter() - start)

    return wrapped


def _is_decode(batch: Any) -> bool:
    mode = batch.forward_mode
    return not (mode.is_extend() or batch.is_extend_in_batch or mode.is_idle())


def patch_scheduler(module: Any) -> None:
    """`sglang.srt.managers.scheduler`: Scheduler's loop phases timed (see the module docstring)."""
    timer = _LoopTimer(os.environ[ENV], os.environ.get(PROFILE_ENV))
    cls = module.Scheduler
    ingest, get_next, run_batch, process = (
        cls.ingest_requests,
        cls.get_next_batch_to_run,
        cls.run_batch,
        cls.process_batch_result,
    )

    def ingest_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        timer.profile(False)
        timer.iteration_start()
        timer.profile(True)
        start = time.perf_counter()
        out = ingest(self, *args, **kwargs)
        timer.add("ingest", time.perf_counter() - start)
        return out

    def get_next_batch_to_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _timed(timer, "next", get_next)(self, *args, **kwargs)

    def timed_run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        worker = self.model_worker
        if not getattr(worker, "_loop_timer_wrapped", False):
            worker.forward_batch_generation = _round(timer, worker.forward_batch_generation)
            worker._loop_timer_wrapped = True
        if _is_decode(batch):
            timer.decode = {"mode": type(worker).__name__, "bs": len(batch.reqs)}
        start = time.perf_counter()
        try:
            return run_batch(self, batch, *args, **kwargs)
        finally:
            timer.add("run", time.perf_counter() - start - timer.phases.get("round", 0.0) / 1e3)

    def process_batch_result(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return process(self, *args, **kwargs)
        finally:
            timer.add("process", time.perf_counter() - start)

    cls.ingest_requests = ingest_requests
    cls.get_next_batch_to_run = get_next_batch_to_run
    cls.run_batch = timed_run_batch
    cls.process_batch_result = process_batch_result


def _round(timer: _LoopTimer, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The worker's round: timed, and left out of the profile."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        timer.profile(False)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.add("round", time.perf_counter() - start)
            timer.profile(True)

    return wrapped
