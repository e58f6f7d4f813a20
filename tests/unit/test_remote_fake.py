from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.commands import Cmd, Masked
from opsctl.errors import RemoteError, UnreachableError
from opsctl.remote import Connection, SecretOnCommandLine
from opsctl.remote.fake import FakeHost


def test_fake_answers_by_display_form_and_records() -> None:
    host = FakeHost("h", answers={"systemctl is-active x": (3, "inactive\n", "")})
    assert isinstance(host, Connection)
    result = host.run(Cmd.of("systemctl", "is-active", "x"), check=False)
    assert (result.exit_code, result.stdout) == (3, "inactive\n")
    with pytest.raises(RemoteError):
        host.run(Cmd.of("systemctl", "is-active", "x"))
    assert host.run(Cmd.of("true")).ok  # default answer
    assert host.ran == ["systemctl is-active x", "systemctl is-active x", "true"]


def test_fake_strict_mode_errors_and_handler() -> None:
    host = FakeHost(
        "h",
        answers={"ping": UnreachableError("h", "down")},
        default=None,
        handler=lambda c: (0, "handled\n", "") if c.argv[0] == "echo" else None,
    )
    with pytest.raises(UnreachableError):
        host.run(Cmd.of("ping"))
    assert host.run(Cmd.of("echo", "x")).stdout == "handled\n"
    with pytest.raises(KeyError):
        host.run(Cmd.of("unknown"))


def test_fake_refuses_secrets_like_the_real_hosts() -> None:
    with pytest.raises(SecretOnCommandLine):
        FakeHost().run(Cmd.of("login", Masked("pw")))


def test_fake_files(tmp_path: Path) -> None:
    host = FakeHost()
    host.put_text("K=V\n", "/etc/x.env", 0o600)
    local = tmp_path / "f"
    local.write_text("data")
    host.put_file(local, "/opt/f")
    host.sync_dir(tmp_path, "/opt/d")
    assert host.files == {"/etc/x.env": ("K=V\n", 0o600), "/opt/f": ("data", 0o644)}
    assert host.get_text("/etc/x.env") == "K=V\n"
    assert host.synced == [(tmp_path, "/opt/d")]
    with pytest.raises(RemoteError):
        host.get_text("/nope")
    host.close()
    assert host.closed
