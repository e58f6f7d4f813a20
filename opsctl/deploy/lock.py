"""The per-host deploy lock: an atomic `mkdir` on the host, with who holds it and since when.

mkdir is atomic on every filesystem and needs no daemon; the lock lives under /run/lock, so a reboot clears
it. The holder file records a random token: only the process that took the lock removes it, so a slow
deploy can never free a lock that a newer one holds. Releasing happens in a `finally` (errors and Ctrl-C).
"""

from __future__ import annotations

import getpass
import os
import secrets
import shlex
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from opsctl.commands import Cmd, sh
from opsctl.errors import DeployError, OpsctlError
from opsctl.remote.base import Connection

LOCK_DIR = "/run/lock/opsctl/deploy.lock"
HOLDER = f"{LOCK_DIR}/holder"
LOCK_CMD_TIMEOUT_S = 30.0  # a lock command is instant; longer means the host is gone


@dataclass(frozen=True)
class LockInfo:
    token: str
    holder: str  # user@machine of the deploying opsctl
    pid: int
    since: str  # ISO 8601 UTC
    action: str  # e.g. "deploy gpu0,gpu1"

    def render(self) -> str:
        return (
            f"token={self.token}\nholder={self.holder}\npid={self.pid}\nsince={self.since}\n"
            f"action={self.action.replace(chr(10), ' ')}\n"
        )

    @staticmethod
    def parse(text: str) -> LockInfo | None:
        """The holder file; None when empty or unreadable (the lock is being taken right now)."""
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        if "token" not in fields:
            return None
        try:
            pid = int(fields.get("pid", "0"))
        except ValueError:
            pid = 0
        return LockInfo(
            fields["token"],
            fields.get("holder", "?"),
            pid,
            fields.get("since", "?"),
            fields.get("action", ""),
        )

    def holder_gone(self) -> bool | None:
        """True when the holder ran on this machine and its process is gone (the lock is stale); None when
        that cannot be known from here (another machine's process)."""
        if self.holder.rpartition("@")[2] != socket.gethostname() or self.pid <= 0:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # exists, owned by someone else
        return False

    def describe(self, now: datetime) -> str:
        age = self.age_s(now)
        ago = "" if age is None else (f", {age / 60:.0f} min ago" if age >= 60 else f", {age:.0f} s ago")
        stale = " (STALE: that process is gone)" if self.holder_gone() else ""
        return f"{self.holder} pid {self.pid} ({self.action}) since {self.since}{ago}{stale}"

    def age_s(self, now: datetime) -> float | None:
        try:
            return (now - datetime.fromisoformat(self.since)).total_seconds()
        except ValueError:
            return None


def new_lock_info(action: str, now: datetime | None = None) -> LockInfo:
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return LockInfo(secrets.token_hex(8), f"{getpass.getuser()}@{socket.gethostname()}", os.getpid(), when, action)


def acquire_cmd(info: LockInfo) -> Cmd:
    """Prints `acquired`, or `held` followed by the current holder file."""
    parent = LOCK_DIR.rsplit("/", 1)[0]
    return sh(
        f"mkdir -p {parent} && if mkdir {LOCK_DIR} 2>/dev/null; then "
        f"printf '%s' {shlex.quote(info.render())} > {HOLDER} && echo acquired; "
        f"else echo held; cat {HOLDER} 2>/dev/null; fi",
        sudo=True,
    )


def release_cmd(token: str) -> Cmd:
    """Remove the lock only if it is still ours."""
    return sh(
        f"if grep -qx {shlex.quote('token=' + token)} {HOLDER} 2>/dev/null; then rm -rf {LOCK_DIR}; fi",
        sudo=True,
    )


def break_cmd() -> Cmd:
    return Cmd.of("rm", "-rf", LOCK_DIR, sudo=True)


def read_cmd() -> Cmd:
    return sh(f"cat {HOLDER} 2>/dev/null || true", sudo=True)


def held_now(conn: Connection, now: datetime) -> tuple[str | None, bool]:
    """What `status` says of the host's deploy lock: (its holder and age, or None when free; whether its holder's
    process is gone, a stale lock)."""
    held = LockInfo.parse(conn.run(read_cmd()).stdout)
    if held is None:
        return None, False
    return held.describe(now), held.holder_gone() is True


def parse_acquire(stdout: str) -> tuple[bool, LockInfo | None]:
    lines = stdout.strip().splitlines()
    if lines and lines[0].strip() == "acquired":
        return True, None
    if lines and lines[0].strip() == "held":
        return False, LockInfo.parse("\n".join(lines[1:]))
    raise DeployError(f"unexpected output from the lock command: {stdout.strip()[:200]!r}")


class LockHeld(DeployError):
    def __init__(self, host: str, info: LockInfo | None, waited: float, now: datetime) -> None:
        self.host = host
        self.info = info
        who = "another deploy (holder not yet recorded)" if info is None else info.describe(now)
        waited_text = f" after waiting {waited:.0f} s" if waited >= 1 else ""
        clear = f"`opsctl deploy --break-lock --host {host} -i INVENTORY` (or `rm -rf {LOCK_DIR}` on the host)"
        super().__init__(
            f"{host}: deploy lock held by {who}{waited_text}",
            f"its holder is gone: clear it with {clear}"
            if info is not None and info.holder_gone()
            else f"wait for it (--lock-wait SECONDS); if no deploy is running (a stale lock), clear it with {clear}",
        )


@contextmanager
def host_lock(
    host: Connection,
    action: str,
    lock_wait: float = 0.0,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    cancelled: Callable[[], bool] = lambda: False,
) -> Iterator[LockInfo]:
    """Hold the host's deploy lock for the block; wait up to `lock_wait` seconds for a held lock."""
    info = new_lock_info(action)
    start = clock()
    while True:
        ok, holder = parse_acquire(host.run(acquire_cmd(info), timeout=LOCK_CMD_TIMEOUT_S).stdout)
        if ok:
            break
        waited = clock() - start
        if waited >= lock_wait or cancelled():
            raise LockHeld(host.name, holder, waited, datetime.now(UTC))
        sleep(min(poll_s, max(0.0, lock_wait - waited)))
    try:
        yield info
    finally:
        try:
            host.run(release_cmd(info.token), check=False, timeout=LOCK_CMD_TIMEOUT_S)
        except OpsctlError:
            pass  # unreachable now: the lock stays; the next deploy's message says how to clear it
