"""One SGLang engine host for the whole pytest run (the `sglang_engine` fixture of tests/runtime/conftest.py).

The host is `tests/runtime/sglang_engine/driver.py --serve`: one process that imports SGLang once, then runs
each Engine job in a child forked from it (SGLang's scheduler and detokenizer forked from that child), so no
launch pays SGLang's import again. Runs are memoised by their whole spec: two tests asking for the same engine
arguments, prompts, token count, environment and overrides share one Engine run. SGLang never enters the
pytest process.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ENGINE_DIR = HERE / "sglang_engine"
# One Engine run, start-up and every batch: the hybrid tree run took 442 s in a local CI run, and the project CI's
# engine tier ran 1.6x slower than that one (its hybrid tree test failed there; the cause is not in its output):
# the limit catches a hang, not a slow machine
RUN_TIMEOUT_S = 1800
HOST_START_TIMEOUT_S = 600  # the host's own SGLang import (85 s seen on a loaded 2-core machine)
# Every run's environment: SGLang's CPU engine path, its Triton kernels run by the CPU interpreter (read when the
# kernels are defined, so on the host, before SGLang is imported), one thread per process.
# torch.compile off: SGLang compiles small elementwise helpers with inductor on the CPU (the repetition penalty's
# `apply_scaling_penalties`, the vocabulary-parallel embedding's `get_masked_input_and_mask`), and on a Sapphire
# Rapids CI machine the compiled penalty wrote NaN into a batch's last row (256 of its 264 logits, so a grammar
# request sampled a token its grammar forbids and the baseline Engine exited); eager gives the same values
# everywhere, and no run pays for the compile (docs/ci.md, "Tests that hold on any CPU").
HOST_ENV = {
    "TORCH_COMPILE_DISABLE": "1",
    "SGLANG_USE_CPU_ENGINE": "1",
    "TRITON_INTERPRET": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONWARNINGS": "ignore",
}

Run = tuple[dict[str, Any], str]  # (the driver's result, the run's combined log)


class EngineHost:
    """`run(...)` -> (result, log) of one Engine job (driver.py's JOB format), memoised by its spec."""

    def __init__(self) -> None:
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._done: dict[str, Run] = {}

    def run(
        self,
        label: str,
        engine: dict[str, Any],
        batches: list[list[list[int]]],
        new_tokens: int,
        env: dict[str, str] | None = None,
        overrides: dict[str, list[dict[str, Any]]] | None = None,
        top_logprobs: int | None = None,
        refusals: list[dict[str, Any]] | None = None,
    ) -> Run:
        spec: dict[str, Any] = {
            "engine": engine,
            "batches": batches,
            "max_new_tokens": new_tokens,
            "overrides": overrides or {},
        }
        if top_logprobs is not None:  # every request returns its log-probs and its top K (driver.py)
            spec["top_logprobs"] = top_logprobs
        if refusals:  # requests sent alone before the batches, their errors kept (driver.py)
            spec["refusals"] = refusals
        key = json.dumps({"spec": spec, "env": env or {}}, sort_keys=True)
        if key not in self._done:
            run_dir = self.workdir / f"{label}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            run_dir.mkdir(parents=True, exist_ok=True)
            self._done[key] = self._launch(run_dir, spec, env or {})
            timing = self._done[key][0]
            print(f"SGLang {label}: start {timing['startup_s']:.1f}s, generate {timing['generate_s']:.1f}s")
        return self._done[key]

    def _launch(self, run_dir: Path, spec: dict[str, Any], env: dict[str, str]) -> Run:
        job, result, log_path = run_dir / "job.json", run_dir / "result.json", run_dir / "engine.log"
        job.write_text(json.dumps(spec))
        proc = self._host()
        assert proc.stdin is not None and proc.stdout is not None
        request = {"job": str(job), "result": str(result), "log": str(log_path), "env": env}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        pid = self._reply(proc.stdout, "pid", HOST_START_TIMEOUT_S)
        try:
            rc = self._reply(proc.stdout, "rc", RUN_TIMEOUT_S)
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)  # the child and every process SGLang started from it
            self._reply(proc.stdout, "rc", 60)
            log = log_path.read_text(errors="replace")
            pytest.fail(f"SGLang engine run timed out after {RUN_TIMEOUT_S}s ({log_path}):\n{log[-6000:]}")
        log = log_path.read_text(errors="replace")
        if rc != 0 or not result.is_file():
            pytest.fail(f"SGLang engine run failed ({rc}; {log_path}):\n{log[-6000:]}")
        return json.loads(result.read_text()), log

    @property
    def workdir(self) -> Path:
        """Where the host's log and each run's job, result and log are kept (made on first use)."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="sglang-host-"))
        return self._workdir

    def start(self) -> None:
        """Start the host (its SGLang import takes a while): early, so it overlaps the tests that run before."""
        self._host()

    def _host(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            pythonpath = [str(ENGINE_DIR), str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p), **HOST_ENV}
            self._log = (self.workdir / "host.log").open("wb")
            self._proc = subprocess.Popen(
                [sys.executable, str(ENGINE_DIR / "driver.py"), "--serve"],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                start_new_session=True,
            )
        return self._proc

    def _reply(self, stream: IO[bytes], field: str, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(field)
            ready, _, _ = select.select([stream], [], [], left)
            if not ready:
                continue
            line = stream.readline()
            if not line:
                log = (self.workdir / "host.log").read_text(errors="replace")
                pytest.fail(f"the SGLang engine host exited ({self.workdir / 'host.log'}):\n{log[-6000:]}")
            return int(json.loads(line)[field])

    def close(self) -> None:
        if self._proc is None:
            return
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc.stdout.close()
        self._log.close()
        self._proc = None
