from __future__ import annotations

import threading
import time

import pytest

from opsctl.errors import CommandTimeout, UnreachableError
from opsctl.remote import base
from opsctl.remote.pool import UnexpectedError, run_parallel


def test_one_outcome_per_item_in_input_order() -> None:
    def work(n: int) -> int:
        time.sleep(0.05 * (5 - n))  # finish in reverse order
        return n * n

    outcomes = run_parallel([1, 2, 3, 4], lambda n: f"h{n}", work)
    assert [(o.host, o.value, o.error) for o in outcomes] == [
        ("h1", 1, None),
        ("h2", 4, None),
        ("h3", 9, None),
        ("h4", 16, None),
    ]


def test_failures_are_per_host_and_never_hide_the_others() -> None:
    def work(n: int) -> str:
        if n == 1:
            raise UnreachableError("h1", "connection refused")
        if n == 2:
            raise CommandTimeout("h2", "sleep 9", 1.0)
        if n == 3:
            raise ZeroDivisionError("bug")
        return "ok"

    outcomes = run_parallel([1, 2, 3, 4], lambda n: f"h{n}", work)
    assert isinstance(outcomes[0].error, UnreachableError)
    assert isinstance(outcomes[1].error, CommandTimeout)
    assert isinstance(outcomes[2].error, UnexpectedError)
    assert "ZeroDivisionError: bug" in outcomes[2].error.one_line()
    assert outcomes[3].ok and outcomes[3].value == "ok"


def test_forks_bounds_concurrency() -> None:
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def work(n: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return n

    run_parallel(list(range(12)), str, work, forks=3)
    assert peak[0] == 3


def test_empty_input() -> None:
    assert run_parallel([], str, str) == []


def test_ctrl_c_cancels_workers_and_reraises() -> None:
    """Ctrl-C in the main thread: running work sees base.CANCEL, queued work never starts."""
    started: list[int] = []
    saw_cancel: list[int] = []

    def work(n: int) -> int:
        started.append(n)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if base.CANCEL.is_set():
                saw_cancel.append(n)
                raise KeyboardInterrupt
            time.sleep(0.01)
        return n

    import signal

    timer = threading.Timer(0.3, signal.pthread_kill, args=(threading.get_ident(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_parallel(list(range(6)), str, work, forks=2)
    assert time.monotonic() - start < 4  # the workers would run their full 5 s without the cancel
    assert sorted(saw_cancel) == sorted(started) and len(started) == 2
    assert not base.CANCEL.is_set()  # cleared for the next run
