"""Progress for every wait longer than a moment: one line at most every `every` seconds, on stderr.

A `Ticker` wraps one wait (a download, a build, a copy, a health wait). The work calls `update(detail)` as it
learns something ("numpy-2.4.6...whl, 16.9 MB"); a heartbeat thread repeats the latest detail with the elapsed
time whenever nothing was printed for `every` seconds, so no wait is ever silent for longer than that. A wait
that ends within `every` seconds prints nothing at all. Lines go to stderr (never stdout: `--json` output
stays clean) through one lock, so parallel hosts' lines never interleave mid-line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

EVERY_S = 2.0

_LOCK = threading.Lock()


def stderr_line(text: str) -> None:
    with _LOCK:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def elapsed(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class Ticker:
    """Progress of one wait (a context manager). `update` is cheap: call it as often as the work likes."""

    def __init__(
        self,
        label: str,
        out: Callable[[str], None] = stderr_line,
        every: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self._out = out
        self._every = every
        self._clock = clock
        self._start = clock()
        self._last_print: float | None = None  # None: nothing printed yet
        self._detail = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def printed(self) -> bool:
        return self._last_print is not None

    def update(self, detail: str) -> None:
        """The latest news; printed now unless a line went out less than `every` seconds ago."""
        with self._lock:
            self._detail = detail
        self._maybe_print()

    def _maybe_print(self) -> None:
        with self._lock:
            now = self._clock()
            since = now - (self._last_print if self._last_print is not None else self._start)
            if since < self._every:
                return
            line = f"{self.label}: {self._detail or 'waiting'} ({elapsed(now - self._start)})"
            self._last_print = now
        self._out(line)

    def _beat(self) -> None:
        while not self._stop.wait(self._every / 4):
            self._maybe_print()

    def __enter__(self) -> Ticker:
        self._start = self._clock()
        self._thread = threading.Thread(target=self._beat, name=f"progress {self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._last_print is not None:  # only a wait that said something says how it ended
            took = elapsed(self._clock() - self._start)
            self._out(f"{self.label}: {'done' if kind is None else 'failed'} after {took}")
