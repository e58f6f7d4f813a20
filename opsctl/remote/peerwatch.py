"""Dead-peer detection on one SSH connection.

paramiko's `set_keepalive` only sends: a host that powered off, hung, or whose network dropped away sends no RST,
TCP keeps the connection open, and a command waiting for output waits for its whole timeout. OpenSSH's client
asks for a reply instead (`ServerAliveInterval`); this does the same for paramiko: after `interval` seconds with
nothing from the host, one `keepalive@openssh.com` request that wants a reply goes out (sshd answers it, with a
failure, like OpenSSH's own), and no answer within `interval` seconds more means the host is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

PROBE_REQUEST = "keepalive@openssh.com"


class Transport(Protocol):
    """The part of paramiko.Transport used here (a fake in unit tests)."""

    def global_request(self, kind: str, data: Iterable[Any] | None = None, wait: bool = True) -> object: ...


class PeerWatch:
    """One per connection, shared by every command waiting on it (one probe in flight at a time: paramiko keeps
    a single pending global request per transport)."""

    def __init__(self, transport: Transport, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._transport = transport
        self._clock = clock
        self._lock = threading.Lock()
        self._heard = clock()  # the last time anything came from the host
        self._probe_sent: float | None = None

    def heard(self) -> None:
        """Something came from the host: output on a channel, or the answer to a probe."""
        with self._lock:
            self._heard = self._clock()

    def silent_for(self) -> float | None:
        """Seconds since the host was last heard, once a probe has gone unanswered for `interval`; else None.
        Sends the probe when the silence reaches `interval`."""
        with self._lock:
            now = self._clock()
            if now - self._heard < self.interval:
                return None
            if self._probe_sent is None:
                self._probe_sent = now
                threading.Thread(target=self._probe, name="opsctl-peerwatch", daemon=True).start()
                return None
            if now - self._probe_sent < self.interval:
                return None
            return now - self._heard

    def _probe(self) -> None:
        # global_request(wait=True) returns on the reply, or once the transport closes (then nothing is heard)
        try:
            answered = self._transport_answers()
        finally:
            with self._lock:
                self._probe_sent = None
                if answered:
                    self._heard = self._clock()

    def _transport_answers(self) -> bool:
        try:
            self._transport.global_request(PROBE_REQUEST, wait=True)
        except Exception:  # the transport died under the probe: not an answer
            return False
        return bool(getattr(self._transport, "active", True))
