"""Run per-host work in parallel, bounded, with one outcome per item; no failure hides another's result."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from opsctl.errors import OpsctlError
from opsctl.remote import base

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("opsctl.remote")


@dataclass(frozen=True)
class HostOutcome(Generic[R]):
    host: str
    value: R | None
    error: OpsctlError | None

    @property
    def ok(self) -> bool:
        return self.error is None


class UnexpectedError(OpsctlError):
    """A bug surfaced while working on one host; reported for that host, never hiding the others."""


def run_parallel(
    items: Sequence[T], key: Callable[[T], str], fn: Callable[[T], R], forks: int = 16
) -> list[HostOutcome[R]]:
    """fn(item) for every item, at most `forks` at once; outcomes in input order.

    Ctrl-C: sets base.CANCEL so running commands kill their remote process groups, drops queued work, waits
    for the running ones to stop, then re-raises KeyboardInterrupt (the CLI exits 130).
    """
    if not items:
        return []
    workers = max(1, min(forks, len(items)))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opsctl-host")
    futures: list[Future[R]] = []
    try:
        futures = [pool.submit(fn, item) for item in items]
        pending = set(futures)
        while pending:
            # A short wait keeps the main thread responsive to Ctrl-C.
            _, pending = wait(pending, timeout=base.POLL_S)
    except KeyboardInterrupt:
        base.CANCEL.set()
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)
        base.CANCEL.clear()
        raise
    pool.shutdown(wait=True)
    return [_outcome(key(item), future) for item, future in zip(items, futures, strict=True)]


def _outcome(name: str, future: Future[R]) -> HostOutcome[R]:
    exc = future.exception()
    if exc is None:
        return HostOutcome(name, future.result(), None)
    if isinstance(exc, OpsctlError):
        return HostOutcome(name, None, exc)
    log.error("%s: unexpected error", name, exc_info=exc)
    hint = "this is a bug in opsctl; run with --verbose"
    error = UnexpectedError(f"{name}: {type(exc).__name__}: {exc}", hint)
    return HostOutcome(name, None, error)
