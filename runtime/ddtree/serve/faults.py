"""Test faults for the lab: a server that is slower, or answers other tokens than it computed, on purpose.

A canary's lab test needs a release that is bad in one known way and fine in every other. The faults are
asked for by the service's environment (`DELAY_ENV`: milliseconds slept inside every decode round, in the
target's decode or verify forward, so that the engine's own round timings and DDTREE tok/s see it as they
would a slow flag; `FLIP_ENV=1`: every output token id with its lowest bit flipped) and are armed only while
the file `MARKER` exists when the worker starts, which no production host has: an environment alone does
nothing. Decided once at start; unarmed, the engine and its stream are used as they are.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("ddtree.serve")

MARKER = "/etc/ddtree/test-faults-armed"
DELAY_ENV = "OPSCTL_FAULT_DELAY_MS"  # not DDTREE_*: inventories may not set those (extra_env)
FLIP_ENV = "OPSCTL_FAULT_FLIP"

StreamFn = Callable[..., Iterator[Sequence[int]]]


class _Runner(Protocol):
    decode: Callable[..., Any]  # baseline's round
    verify: Callable[..., Any]  # a speculative round's target forward


class _Engine(Protocol):
    runner: _Runner
    stream: StreamFn


@dataclass(frozen=True)
class Faults:
    delay_s: float = 0.0  # slept in each decode round's target forward (not the prefill's)
    flip: bool = False

    @property
    def any(self) -> bool:
        return self.delay_s > 0 or self.flip


def from_env(environ: Mapping[str, str], armed: bool) -> Faults:
    """The faults the environment asks for, if `armed` (the marker exists); a malformed delay is no delay."""
    if not armed:
        return Faults()
    try:
        delay_ms = max(0.0, min(60_000.0, float(environ.get(DELAY_ENV, "0") or 0)))
    except ValueError:
        delay_ms = 0.0
    return Faults(delay_ms / 1000, environ.get(FLIP_ENV, "") == "1")


def slow_rounds(runner: _Runner, delay_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """Every decode round's target forward of `runner` takes `delay_s` longer (the prefill's does not)."""

    def slowed(forward: Callable[..., Any]) -> Callable[..., Any]:
        def slow(*args: Any, **kwargs: Any) -> Any:
            sleep(delay_s)
            return forward(*args, **kwargs)

        return slow

    runner.decode = slowed(runner.decode)
    runner.verify = slowed(runner.verify)


def flip_tokens(stream: StreamFn) -> StreamFn:
    def flipped(*args: Any, **kwargs: Any) -> Iterator[Sequence[int]]:
        for chunk in stream(*args, **kwargs):
            yield [int(t) ^ 1 for t in chunk]

    return flipped


def for_worker(engine: _Engine, environ: Mapping[str, str] | None = None, marker: str = MARKER) -> StreamFn:
    """The stream the worker runs: the engine's, or with the armed faults (logged as a warning)."""
    env = os.environ if environ is None else environ
    if DELAY_ENV not in env and FLIP_ENV not in env:
        return engine.stream
    faults = from_env(env, os.path.exists(marker))
    if not faults.any:
        log.info("test faults asked for but not armed (%s absent): serving normally", marker)
        return engine.stream
    log.warning("TEST FAULTS ARMED (%s exists): delay %.0f ms a round, flip %s", marker, faults.delay_s * 1000,
                faults.flip)  # fmt: skip
    if faults.delay_s:
        slow_rounds(engine.runner, faults.delay_s)
    return flip_tokens(engine.stream) if faults.flip else engine.stream
