"""A bounded steady client: at most `rate` chat completions per second (one at a time, paced: the issue's
"one chat completion every 100 ms"), for at most `max_s` seconds or until stopped. What a deploy looks like
to a client: every request that did not get HTTP 200 with a completion, by cause, and the longest stretch
without a successful answer.

Used by the lab tests that deploy behind sglang-router (tests/lab/test_router.py) and, for contrast, straight
against one service. Never raises for a failed request: failures are the measurement.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class Reply:
    sent_at: float  # seconds since the run started
    latency_s: float
    ok: bool
    cause: str  # "ok", "HTTP 503", "ConnectError", ...


@dataclass
class SteadyReport:
    rate: float
    duration_s: float = 0.0
    replies: list[Reply] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.replies)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.replies if not r.ok)

    @property
    def causes(self) -> dict[str, int]:
        return dict(Counter(r.cause for r in self.replies if not r.ok))

    @property
    def longest_gap_s(self) -> float:
        """Longest time between two requests sent that both succeeded, with only failures sent in between."""
        gap, last_ok = 0.0, 0.0
        for reply in sorted(self.replies, key=lambda r: r.sent_at):
            if reply.ok:
                gap = max(gap, reply.sent_at - last_ok)
                last_ok = reply.sent_at
        failures_after = [r.sent_at for r in self.replies if not r.ok and r.sent_at > last_ok]
        if failures_after:
            gap = max(gap, max(failures_after) - last_ok)
        return gap if self.failed else 0.0

    def summary(self) -> str:
        causes = ", ".join(f"{k} x{v}" for k, v in sorted(self.causes.items())) or "none"
        return (
            f"{self.sent} requests at {self.rate:g}/s over {self.duration_s:.1f}s: {self.failed} failed "
            f"({causes}); longest gap {self.longest_gap_s:.1f}s"
        )


def judge(status: int, body: Any) -> str:
    """ "ok" for HTTP 200 carrying a completion, else the cause."""
    if status != 200:
        return f"HTTP {status}"
    try:
        choice = body["choices"][0]
        text = choice["message"].get("content") or choice["message"].get("reasoning_content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return "malformed answer"
    return "ok" if text else "empty answer"


class SteadyClient:
    def __init__(
        self,
        url: str,  # base URL (a router or a service)
        rate: float = 10.0,
        max_s: float = 120.0,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.rate = rate
        self.max_s = max_s
        self.headers = headers or {}
        self.body = body or {
            "model": "default",
            "messages": [{"role": "user", "content": "count from 1 to 5"}],
            "max_tokens": 4,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        self.timeout_s = timeout_s
        self.stop = threading.Event()
        self.report = SteadyReport(rate)
        self._thread: threading.Thread | None = None

    def _one(self, http: httpx.Client, t0: float) -> Reply:
        sent = time.monotonic()
        try:
            response = http.post(self.url, json=self.body, headers=self.headers, timeout=self.timeout_s)
            try:
                body = response.json()
            except ValueError:
                body = None
            cause = judge(response.status_code, body)
        except httpx.HTTPError as exc:
            cause = type(exc).__name__
        return Reply(sent - t0, time.monotonic() - sent, cause == "ok", cause)

    def run(self) -> SteadyReport:
        """One request at a time, the next sent 1/rate after the previous one was (or at once, when it took
        longer): at most `rate` per second, never a queue the servers cannot work off. Until stopped or max_s."""
        with httpx.Client() as http:
            t0 = time.monotonic()
            while not self.stop.is_set() and time.monotonic() - t0 < self.max_s:
                sent = time.monotonic()
                self.report.replies.append(self._one(http, t0))
                self.stop.wait(max(0.0, sent + 1.0 / self.rate - time.monotonic()))
            self.report.duration_s = time.monotonic() - t0
        return self.report

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    def finish(self) -> SteadyReport:
        self.stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.report
