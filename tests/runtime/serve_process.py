"""The reference server as the runtime tests start it, and the run's one pool of them.

`ServeProcess` is one `python -m ddtree.serve --config server.yaml` process started the way opsctl starts it (the
API key in the file, DDTREE_* in the environment), its stderr captured to a file. `ServerPool` is the session's
servers, one per (arch, mode): test_serve_http and test_serve_openai take theirs from the `reference_servers`
fixture (tests/runtime/conftest.py), so a configuration two modules use starts once (a start is ~10 CPU-s, nearly
all imports). A test that watches a server start or stop (test_serve_http's SIGTERM test) starts its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import yaml
from ddtree.serve import sse
from prometheus_client.parser import text_string_to_metric_families

API_KEY = "test-key-4b1d"  # travels in the --config file, as opsctl renders it; never in argv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServeProcess:
    """One `python -m ddtree.serve --config server.yaml` process, stderr captured to a file."""

    proc: subprocess.Popen[bytes]
    url: str
    models: Path
    log: Path
    started: float = field(default_factory=time.monotonic)
    health_seen: list[int] = field(default_factory=list)
    signalled: bool = False

    @classmethod
    def start(cls, models: Path, mode: str, work: Path) -> ServeProcess:
        port = free_port()
        cfg: dict[str, Any] = {
            "model-path": str(models / "target"),
            "host": "127.0.0.1",
            "port": port,
            "served-model-name": "tiny",
            "device": "cpu",
            "dtype": "float32",
            "api-key": API_KEY,
            "decode-log-interval": 4,
            "enable-metrics": True,
        }
        if mode != "baseline":
            cfg["speculative-algorithm"] = "DFLASH" if mode == "linear" else "DDTREE"
            cfg["speculative-draft-model-path"] = str(models / "draft")
        if mode in ("shadow", "tree"):  # what opsctl renders for DDTREE; accepted and recorded here
            cfg.update({"disable-overlap-schedule": True, "page-size": 1, "attention-backend": "triton"})
        (work / "server.yaml").write_text(yaml.safe_dump(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DDTREE_", "SGLANG_API_KEY"))}
        env.update({"OMP_NUM_THREADS": "1", "DDTREE_LOG_INTERVAL": "2"})
        if mode in ("shadow", "tree"):
            env["DDTREE_VERIFY"] = mode
        log = work / "stderr.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ddtree.serve", "--config", str(work / "server.yaml")],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        return cls(proc, f"http://127.0.0.1:{port}", models, log)

    def wait_ready(self, timeout: float = 300.0) -> ServeProcess:
        """Poll /health until 200; remember every status seen (503 while loading)."""
        if self.health_seen and self.health_seen[-1] == 200:
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.stderr()[-3000:]}")
            try:
                code = httpx.get(f"{self.url}/health", timeout=5).status_code
            except httpx.TransportError:
                code = 0  # not listening yet
            if not self.health_seen or self.health_seen[-1] != code:
                self.health_seen.append(code)
            if code == 200:
                return self
            time.sleep(0.02)
        raise AssertionError(f"server not healthy after {timeout}s:\n{self.stderr()[-3000:]}")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers=self.headers, timeout=60)

    def post(self, path: str, body: Any, timeout: float = 120) -> httpx.Response:
        if isinstance(body, bytes):
            hdrs = {**self.headers, "Content-Type": "application/json"}
            return httpx.post(f"{self.url}{path}", content=body, headers=hdrs, timeout=timeout)
        return httpx.post(f"{self.url}{path}", json=body, headers=self.headers, timeout=timeout)

    @staticmethod
    def sse(response: httpx.Response) -> list[Any]:
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse.parse_events(response.text)

    def metric(self, name: str) -> float:
        for fam in text_string_to_metric_families(self.get("/metrics").text):
            if fam.name == name:
                return float(fam.samples[0].value)
        raise AssertionError(f"{name} not in /metrics")

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.models / "target"), local_files_only=True)

    def chat_ids(self, q: str, thinking: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def signal_stop(self) -> None:
        if self.proc.poll() is None and not self.signalled:
            self.proc.send_signal(signal.SIGTERM)
            self.signalled = True

    def stop(self, timeout: float = 60) -> int:
        self.signal_stop()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


class ServerPool:
    """pool(arch, mode, *also) -> a ready server, started on first use (together with the `also` modes, so their
    start-ups overlap) and kept until `stop_all`. `models(arch)` is the tiny models' directory for an arch
    ("dense", "hybrid"), `workdir(name)` a fresh directory for a server's config and log."""

    def __init__(self, models: Callable[[str], Path], workdir: Callable[[str], Path]) -> None:
        self._models, self._workdir = models, workdir
        self.started: dict[tuple[str, str], ServeProcess] = {}

    def __call__(self, arch: str, mode: str, *also: str) -> ServeProcess:
        for m in (mode, *also):
            if (arch, m) not in self.started:
                self.started[(arch, m)] = ServeProcess.start(self._models(arch), m, self._workdir(f"serve-{arch}-{m}"))
        for m in (mode, *also):
            self.started[(arch, m)].wait_ready()
        return self.started[(arch, mode)]

    def stop_all(self) -> dict[tuple[str, str], int]:
        """SIGTERM every server first (they drain and exit in parallel), then wait: each one's exit status. The
        pool is empty after."""
        for proc in self.started.values():
            proc.signal_stop()
        codes = {key: proc.stop() for key, proc in self.started.items()}
        self.started.clear()
        return codes
