"""Serving statistics: Prometheus metrics under SGLang's names and SGLang's ``Decode batch`` log line.

The worker thread calls ``on_*``; /metrics renders ``registry``. Metric names follow SGLang's collector
(``sglang:num_running_reqs``, ``sglang:spec_accept_length``, ...), labelled ``model_name`` like SGLang's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# SGLang's own inter-token buckets (its collector's defaults), so canary percentiles compare alike
_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
                0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip


@dataclass(frozen=True)
class DecodeWindow:
    """What one ``Decode batch`` line reports: the rounds since the previous line."""

    running: int
    tokens_in_kv: int  # prompt + generated tokens of the running request
    token_usage: float  # tokens_in_kv / context length
    accept_len: float | None  # committed tokens per round incl. bonus; None in baseline (SGLang omits it)
    accept_rate: float | None  # (accept_len - 1) / drafted tokens per round
    gen_throughput: float  # committed tokens / second over the window
    queued: int


def decode_batch_line(w: DecodeWindow) -> str:
    """SGLang's scheduler line; baseline has no accept fields, exactly as SGLang without speculation."""
    parts = [
        f"Decode batch, #running-req: {w.running}",
        f"#token: {w.tokens_in_kv}",
        f"token usage: {w.token_usage:.2f}",
    ]
    if w.accept_len is not None:
        parts.append(f"accept len: {w.accept_len:.2f}")
        parts.append(f"accept rate: {w.accept_rate if w.accept_rate is not None else 0.0:.2f}")
    parts.append("cuda graph: False")
    parts.append(f"gen throughput (token/s): {w.gen_throughput:.2f}")
    parts.append(f"#queue-req: {w.queued}")
    return ", ".join(parts)


class ServerStats:
    """Thread-safe counters behind /metrics and the decode log line."""

    def __init__(
        self,
        model_name: str,
        context_len: int,
        speculative: bool,
        draft_tokens_per_round: int | None,
        log_every: int,
        emit: Callable[[str], None],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, names = self.registry, ["model_name"]

        # Children labelled once; creating them here makes every series exist before the first request.
        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Any:
            return Histogram(name, doc, names, registry=r, buckets=buckets).labels(model_name)

        self._running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self._queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self._used = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self._usage = gauge("sglang:token_usage", "The token usage.")
        self._tput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self._accept_len = gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.")
        self._accept_rate = gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding.")
        self._prompt = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self._gen = counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self._reqs = counter("sglang:num_requests", "The number of processed requests.")
        self._aborted = counter("sglang:num_aborted_requests", "The number of aborted requests.")
        self._ttft = histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
        self._e2e = histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency in seconds.")
        self._itl = histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self._context_len = context_len
        self._speculative = speculative
        self._draft_tokens = draft_tokens_per_round
        self._log_every = log_every
        self._emit = emit
        self._lock = threading.Lock()
        self._win_rounds = 0
        self._win_tokens = 0
        self._win_seconds = 0.0
        self._queue_len = 0
        self._in_kv = 0

    def set_queue(self, queued: int) -> None:
        with self._lock:
            self._queue_len = queued
            self._queued.set(queued)

    def on_start(self, prompt_len: int) -> None:
        with self._lock:
            self._running.set(1)
            self._prompt.inc(prompt_len)
            self._in_kv = prompt_len

    def on_first_token(self, tokens: int, seconds: float) -> None:
        """The prefill's token: counted as generated, but not a decode round of the accept-length window."""
        with self._lock:
            self._ttft.observe(seconds)
            self._gen.inc(tokens)
            self._in_kv += tokens

    def on_round(self, committed: int, seconds: float) -> None:
        """One engine round (one target forward) committed ``committed`` tokens in ``seconds``."""
        line = None
        with self._lock:
            for _ in range(committed):  # as SGLang: the round's time spread over the tokens it committed
                self._itl.observe(seconds / committed)
            self._gen.inc(committed)
            self._in_kv += committed
            self._win_rounds += 1
            self._win_tokens += committed
            self._win_seconds += seconds
            self._used.set(self._in_kv)
            self._usage.set(self._in_kv / self._context_len)
            if self._win_rounds >= self._log_every:
                line = decode_batch_line(self._close_window())
        if line is not None:
            self._emit(line)

    def _close_window(self) -> DecodeWindow:
        # busy time only: idle gaps between requests must not dilute the throughput
        tput = self._win_tokens / max(self._win_seconds, 1e-9)
        accept_len = accept_rate = None
        if self._speculative:
            accept_len = self._win_tokens / self._win_rounds
            if self._draft_tokens:
                accept_rate = min(1.0, (accept_len - 1.0) / self._draft_tokens)
            self._accept_len.set(accept_len)
            self._accept_rate.set(accept_rate or 0.0)
        self._tput.set(tput)
        w = DecodeWindow(
            running=1,
            tokens_in_kv=self._in_kv,
            token_usage=self._in_kv / self._context_len,
            accept_len=accept_len,
            accept_rate=accept_rate,
            gen_throughput=tput,
            queued=self._queue_len,
        )
        self._win_rounds = 0
        self._win_tokens = 0
        self._win_seconds = 0.0
        return w

    def on_finish(self, seconds: float, aborted: bool = False) -> None:
        with self._lock:
            self._running.set(0)
            self._in_kv = 0
            self._used.set(0)
            self._usage.set(0)
            self._reqs.inc()
            if aborted:
                self._aborted.inc()
            self._e2e.observe(seconds)

    def on_abort_queued(self, seconds: float) -> None:
        """A request cancelled before it ran: counted and aborted, while the running request's gauges stay."""
        with self._lock:
            self._reqs.inc()
            self._aborted.inc()
            self._e2e.observe(seconds)
