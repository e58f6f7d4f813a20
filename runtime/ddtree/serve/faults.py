"""Test faults for the lab: a server that is slower, or answers other tokens than it computed, on purpose.

A canary's lab test needs a release that is bad in one known way and fine in every other. The faults are
asked for by the service's environment (`DELAY_ENV`: milliseconds slept before every decode round's tokens;
`FLIP_ENV=1`: every output token id with its lowest bit flipped) and are armed only while the file `MARKER`
exists when the worker starts, which no production host has: an environment alone does nothing. Decided
once at start; unarmed, the engine's stream is used as it is.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("ddtree.serve")

MARKER = "/etc/ddtree/test-faults-armed"
DELAY_ENV = "OPSCTL_FAULT_DELAY_MS"  # not DDTREE_*: inventories may not set those (extra_env)
FLIP_ENV = "OPSCTL_FAULT_FLIP"

StreamFn = Callable[..., Iterator[Sequence[int]]]


@dataclass(frozen=True)
class Faults:
    delay_s: float = 0.0  # slept before each decode round's tokens (not the prefill's first token)
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


def wrap(stream: StreamFn, faults: Faults, sleep: Callable[[float], None] = time.sleep) -> StreamFn:
    if not faults.any:
        return stream

    def faulty(*args: Any, **kwargs: Any) -> Iterator[Sequence[int]]:
        for i, chunk in enumerate(stream(*args, **kwargs)):
            if i > 0 and faults.delay_s:
                sleep(faults.delay_s)
            yield [int(t) ^ 1 for t in chunk] if faults.flip else chunk

    return faulty


def for_worker(stream: StreamFn, environ: Mapping[str, str] | None = None, marker: str = MARKER) -> StreamFn:
    """The stream the worker runs: the engine's, or with the armed faults (logged as a warning)."""
    env = os.environ if environ is None else environ
    if DELAY_ENV not in env and FLIP_ENV not in env:
        return stream
    faults = from_env(env, os.path.exists(marker))
    if faults.any:
        log.warning("TEST FAULTS ARMED (%s exists): delay %.0f ms a round, flip %s", marker, faults.delay_s * 1000,
                    faults.flip)  # fmt: skip
    else:
        log.info("test faults asked for but not armed (%s absent): serving normally", marker)
    return wrap(stream, faults)
