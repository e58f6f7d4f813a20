"""`opsctl bench --concurrency 1,4,8`: the same streamed chat requests, N in flight at once, per level.

A user's tok/s depends on how many requests share the GPU: speculative decoding's gain shrinks as the batch
grows. Each level keeps `concurrency` requests in flight (a thread each, over one connection pool) until
`max(repeat * prompts, 2 * concurrency)` requests have finished, and reports: output tok/s per request (median),
output tok/s of the whole level (all completion tokens / the level's wall time: per GPU once divided by the
service's GPUs), TTFT and inter-token latency (medians), and tau (completion tokens per verify round, from
SGLang's per-request `spec_tokens_details`, when the server reports it).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from opsctl.bench.measure import Sample, stream_chat_rounds
from opsctl.bench.prompts import BenchPrompt
from opsctl.chat import chat_body, first_model
from opsctl.errors import OpsctlError
from opsctl.health import auth_headers, base_url
from opsctl.inventory.model import Engine, Host, Service

LEVELS_MAX = 256


def parse_levels(text: str) -> tuple[int, ...]:
    """`1,4,8,16,32` -> (1, 4, 8, 16, 32); each in 1..256, no repeats."""
    try:
        levels = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise OpsctlError(f"--concurrency {text!r}: expected integers like 1,4,8") from None
    if not levels or len(set(levels)) != len(levels) or any(not 1 <= n <= LEVELS_MAX for n in levels):
        raise OpsctlError(f"--concurrency {text!r}: each level must be in 1..{LEVELS_MAX}, once")
    return levels


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    samples: tuple[Sample, ...]
    wall_s: float  # first request sent -> last response finished
    verify_rounds: int | None  # summed over the requests; None when the server reports none

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.samples)

    @property
    def tok_s_total(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tok_s_request(self) -> float:
        return statistics.median(s.tok_s for s in self.samples)

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.ttft_s for s in self.samples)

    @property
    def itl_s(self) -> float:
        """Median over requests of (wall - TTFT) / (tokens - 1): the time between tokens after the first."""
        gaps = [(s.wall_s - s.ttft_s) / (s.completion_tokens - 1) for s in self.samples if s.completion_tokens > 1]
        return statistics.median(gaps) if gaps else 0.0

    @property
    def tau(self) -> float | None:
        if not self.verify_rounds:
            return None
        return self.completion_tokens / self.verify_rounds


def run_level(
    send: Callable[[BenchPrompt, int], tuple[Sample, int | None]],
    prompts: Sequence[BenchPrompt],
    concurrency: int,
    requests: int,
) -> LevelResult:
    """`requests` calls of `send(prompt, repeat)`, `concurrency` at a time, prompts taken round-robin."""
    lock = threading.Lock()
    results: list[tuple[Sample, int | None]] = []

    def one(i: int) -> None:
        result = send(prompts[i % len(prompts)], i // len(prompts))
        with lock:
            results.append(result)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(one, i) for i in range(requests)]:
            future.result()  # an OpsctlError in any request stops the level with its message
    wall = time.perf_counter() - start
    rounds = [r for _, r in results]
    verify = sum(r for r in rounds if r) if all(r for r in rounds) else None
    return LevelResult(concurrency, tuple(s for s, _ in results), wall, verify)


def bench_levels(
    host: Host,
    service: Service,
    prompts: Sequence[BenchPrompt],
    levels: Sequence[int],
    repeat: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] = lambda _: None,
) -> list[LevelResult]:
    base = base_url(host, service)
    headers = auth_headers(service.api_key)
    spec_details = service.engine is Engine.SGLANG and service.mode.speculative
    limits = httpx.Limits(max_connections=max(levels) + 2, max_keepalive_connections=max(levels) + 2)
    with httpx.Client(limits=limits) as client:
        model = first_model(client, base, headers, 30)
        url = f"{base}/v1/chat/completions"

        def send(prompt: BenchPrompt, rep: int) -> tuple[Sample, int | None]:
            body = chat_body(model, prompt.prompt, max_tokens, stream=True, temperature=temperature)
            if spec_details:
                body["return_spec_tokens_details"] = True
            wall, ttft, tokens, finish, rounds = stream_chat_rounds(client, url, body, headers, timeout_s)
            return Sample(prompt.id, rep, tokens, wall, ttft, finish), rounds

        send(prompts[0], -1)  # warm-up
        results = []
        for n in levels:
            result = run_level(send, prompts, n, max(repeat * len(prompts), 2 * n))
            progress(
                f"{service.name} c={n}: {result.tok_s_total:.0f} tok/s total, "
                f"{result.tok_s_request:.0f} per request, tau {result.tau or 0:.2f}"
            )
            results.append(result)
    return results


def level_json(result: LevelResult, gpus: int) -> dict[str, object]:
    return {
        "concurrency": result.concurrency,
        "requests": len(result.samples),
        "completion_tokens": result.completion_tokens,
        "wall_s": round(result.wall_s, 4),
        "tok_s_per_request": round(result.tok_s_request, 2),
        "tok_s_total": round(result.tok_s_total, 2),
        "tok_s_per_gpu": round(result.tok_s_total / max(1, gpus), 2),
        "ttft_s": round(result.ttft_s, 5),
        "itl_s": round(result.itl_s, 6),
        "tau": round(result.tau, 3) if result.tau is not None else None,
        "finish_reasons": sorted({s.finish_reason for s in result.samples}),
    }
