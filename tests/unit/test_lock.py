from datetime import UTC, datetime

import pytest

from opsctl.deploy import lock
from opsctl.deploy.lock import LockHeld, LockInfo, host_lock
from opsctl.errors import DeployError, UnreachableError
from opsctl.remote.fake import FakeHost

NOW = datetime(2026, 11, 29, 22, 0, 0, tzinfo=UTC)


def test_lock_info_roundtrip_and_age():
    info = LockInfo("t0k", "root@ctl", 42, "2026-11-29T21:48:00Z", "deploy gpu0,gpu1")
    parsed = LockInfo.parse(info.render())
    assert parsed == info
    assert parsed.age_s(NOW) == 720.0
    assert LockInfo.parse("") is None  # being acquired right now: no holder written yet
    assert LockInfo("t", "h", 1, "garbage", "").age_s(NOW) is None


def test_acquire_and_release_commands_exact():
    info = LockInfo("abc123", "root@ctl", 7, "2026-11-29T22:00:00Z", "deploy gpu0")
    acquire = lock.acquire_cmd(info)
    assert acquire.sudo
    text = acquire.display()
    assert "mkdir /run/lock/opsctl/deploy.lock 2>/dev/null" in text  # atomic mkdir, no -p
    assert "token=abc123" in text and "echo acquired" in text and "echo held" in text
    release = lock.release_cmd("abc123").display()
    assert "grep -qx token=abc123 /run/lock/opsctl/deploy.lock/holder" in release
    assert "rm -rf /run/lock/opsctl/deploy.lock" in release


def test_parse_acquire():
    assert lock.parse_acquire("acquired\n") == (True, None)
    ok, holder = lock.parse_acquire("held\ntoken=x\nholder=alice@laptop\npid=9\nsince=2026-11-29T21:00:00Z\n")
    assert not ok and holder is not None and holder.holder == "alice@laptop" and holder.pid == 9
    assert lock.parse_acquire("held\n") == (False, None)
    with pytest.raises(DeployError, match="unexpected output"):
        lock.parse_acquire("sudo: a password is required")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


HELD = "held\ntoken=other\nholder=alice@laptop\npid=9\nsince=2026-11-29T21:00:00Z\naction=deploy gpu0\n"


def _host(outputs):
    seq = list(outputs)

    def handler(cmd):
        text = cmd.display()
        if "echo acquired" in text:
            return (0, seq.pop(0) if len(seq) > 1 else seq[0], "")
        return None

    return FakeHost("h1", handler=handler)


def test_host_lock_releases_on_error_and_ctrl_c():
    host = _host(["acquired\n"])
    with pytest.raises(RuntimeError), host_lock(host, "deploy gpu0"):
        raise RuntimeError("boom")
    assert "rm -rf /run/lock/opsctl/deploy.lock" in host.ran[-1]
    host = _host(["acquired\n"])
    with pytest.raises(KeyboardInterrupt), host_lock(host, "deploy gpu0"):
        raise KeyboardInterrupt
    assert "rm -rf /run/lock/opsctl/deploy.lock" in host.ran[-1]


def test_host_lock_refuses_immediately_without_wait():
    host = _host([HELD])
    clock = Clock()
    with pytest.raises(LockHeld) as exc, host_lock(host, "deploy", lock_wait=0, clock=clock, sleep=clock.sleep):
        pass
    msg = exc.value.one_line()
    assert "h1: deploy lock held by alice@laptop pid 9 (deploy gpu0) since 2026-11-29T21:00:00Z" in msg
    assert "--break-lock" in msg and "rm -rf /run/lock/opsctl/deploy.lock" in msg  # how to clear a stale lock
    assert len(host.ran) == 1  # never released a lock it did not take


def test_host_lock_waits_then_acquires():
    host = _host([HELD, HELD, "acquired\n"])
    clock = Clock()
    with host_lock(host, "deploy", lock_wait=10, poll_s=1, clock=clock, sleep=clock.sleep):
        assert clock.t == 2.0
    assert sum("echo acquired" in c for c in host.ran) == 3


def test_host_lock_wait_times_out():
    host = _host([HELD])
    clock = Clock()
    with (
        pytest.raises(LockHeld, match="after waiting 3 s"),
        host_lock(host, "deploy", lock_wait=3, poll_s=1, clock=clock, sleep=clock.sleep),
    ):
        pass


def test_release_failure_does_not_mask_the_outcome():
    def handler(cmd):
        if "echo acquired" in cmd.display():
            return (0, "acquired\n", "")
        return UnreachableError("h1", "gone")

    host = FakeHost("h1", handler=handler)
    with host_lock(host, "deploy"):
        pass  # no exception from the unreachable release
