"""Progress for every wait longer than a moment: one line at most every `every` seconds, on stderr.

A `Ticker` wraps one wait (a download, a build, a copy, a health wait). The work calls `update(detail)` as it
learns something ("numpy-2.4.6...whl, 16.9 MB"): news is printed at most every `every` seconds (2), and a
heartbeat thread repeats the latest detail with the elapsed time when nothing was printed for twice that, so no
wait is ever silent for more than ~4.5 s. A wait that ends within `every` seconds prints nothing at all.
Lines go to stderr (never stdout: `--json` output stays clean) through one lock, so parallel hosts' lines never
interleave mid-line. `run_streamed` runs a local
tool and hands each output line over as it comes, for the work to turn into `update`s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        limit: float | None = None,
    ) -> None:
        self.label = label
        self._limit = limit  # a timeout the wait runs against: shown as "12s of 300s"
        self._out = out
        self._every = every if every is not None else EVERY_S
        self._clock = clock
        self._start = clock()
        self._last_print: float | None = None  # None: nothing printed yet
        self._detail = ""
        self._printed = ""  # the detail of the last line printed
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
            if self._last_print is None:
                if now - self._start < self._every:
                    return
            elif now - self._last_print < (self._every if self._detail != self._printed else 2 * self._every):
                return  # news at most every `every` s; the same news again after twice that
            took = elapsed(now - self._start) + (f" of {elapsed(self._limit)}" if self._limit is not None else "")
            line = f"{self.label}: {self._detail or 'waiting'} ({took})"
            self._last_print = now
            self._printed = self._detail
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


@dataclass(frozen=True)
class Streamed:
    exit_code: int
    tail: tuple[str, ...]  # the last non-blank lines of output (stdout and stderr together)
    timed_out: bool = False
    cancelled: bool = False


def run_streamed(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    keep: int = 40,
    noise: Callable[[str], bool] = lambda line: False,
    cancelled: Callable[[], bool] = lambda: False,
) -> Streamed:
    """Run `argv` on this machine, each output line handed to `on_line` as it comes (for a Ticker); lines
    that `noise` picks (progress counters) are not kept in the tail.

    Its own process group: a timeout or Ctrl-C kills everything it started."""
    tail: deque[str] = deque(maxlen=keep)
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env=dict(env) if env is not None else None,
        start_new_session=True,
    ) as proc:
        fired, stopped, finished = threading.Event(), threading.Event(), threading.Event()
        deadline = None if timeout is None else time.monotonic() + timeout

        def watchdog() -> None:  # kills the group on timeout or cancellation (Ctrl-C seen by another thread)
            while not finished.wait(0.2):
                if cancelled():
                    stopped.set()
                elif deadline is not None and time.monotonic() >= deadline:
                    fired.set()
                else:
                    continue
                _kill(proc)
                return

        watcher = threading.Thread(target=watchdog, daemon=True)
        watcher.start()
        try:
            if proc.stdout is not None:
                for line in proc.stdout:
                    if line.strip() and not noise(line):
                        tail.append(line.rstrip())
                    on_line(line)
            code = proc.wait()
        except BaseException:
            _kill(proc)
            raise
        finally:
            finished.set()
            watcher.join()
    return Streamed(code, tuple(tail), fired.is_set(), stopped.is_set())


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
