"""opsctl.remote.peerwatch: when a silent host is declared gone (fake transport and clock; the lab test
`test_silent_host_is_unreachable_within_two_keepalives` cuts a real host's network)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from opsctl.remote.peerwatch import PROBE_REQUEST, PeerWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Transport:
    """Answers each probe when `answer` is set (a live sshd); never, while it is clear (a silent host)."""

    def __init__(self, answering: bool) -> None:
        self.active = True
        self.answer = threading.Event()
        if answering:
            self.answer.set()
        self.requests: list[tuple[str, bool]] = []
        self.returned = threading.Event()

    def global_request(self, kind: str, data: Iterable[Any] | None = None, wait: bool = True) -> object:
        self.requests.append((kind, wait))
        while not self.answer.wait(0.01):
            if not self.active:
                break
        self.returned.set()
        return None  # sshd answers an unknown request with a failure: still an answer


def test_a_host_heard_within_the_interval_sends_no_probe() -> None:
    clock, transport = Clock(), Transport(answering=False)
    watch = PeerWatch(transport, 5, clock)
    for _ in range(10):
        clock.now += 4
        watch.heard()
        assert watch.silent_for() is None
    assert transport.requests == []


def test_a_silent_host_that_answers_every_probe_is_never_declared_gone() -> None:
    clock, transport = Clock(), Transport(answering=True)
    watch = PeerWatch(transport, 5, clock)
    for probes in range(1, 6):  # a command that prints nothing for a long time, on a live host
        clock.now += 7
        assert watch.silent_for() is None  # a probe goes out
        assert transport.returned.wait(5)
        transport.returned.clear()
        while len(transport.requests) < probes or watch._probe_sent is not None:  # the answer is recorded
            threading.Event().wait(0.01)
        clock.now += 4.9
        assert watch.silent_for() is None  # heard at the answer: less than an interval since
    assert transport.requests == [(PROBE_REQUEST, True)] * 5  # a reply is asked for, unlike paramiko's keepalive


def test_an_unanswered_probe_declares_the_host_gone_after_a_second_interval() -> None:
    clock, transport = Clock(), Transport(answering=False)
    watch = PeerWatch(transport, 5, clock)
    clock.now += 5
    assert watch.silent_for() is None  # probe sent
    clock.now += 4.9
    assert watch.silent_for() is None
    clock.now += 0.1
    assert watch.silent_for() == 10.0  # seconds since the host was last heard
    assert len(transport.requests) == 1  # one probe in flight at a time
    transport.active = False  # closing the connection ends the probe, which counts as no answer
    assert transport.returned.wait(5)
    clock.now += 1
    assert watch.silent_for() is None  # a fresh probe after the old one ended unanswered
    assert len(transport.requests) == 2
