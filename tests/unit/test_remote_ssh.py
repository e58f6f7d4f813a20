"""Pure parts of the SSH layer: endpoints, the rsync ssh command, error translation, host-key policy."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import paramiko
import pytest

from opsctl.errors import HostKeyError, RemoteError, UnreachableError
from opsctl.inventory.model import Host, HostKeyPolicy, SshConfig
from opsctl.remote.rsync import rsync_error, ssh_command
from opsctl.remote.ssh import Endpoint, SshHost, _host_key_reason, _Policy, _put_text_cmd, _UnknownHostKey


def _host(**ssh: object) -> Host:
    return Host(
        name="gpu1",
        address="10.0.0.5",
        ssh=SshConfig(**ssh),  # type: ignore[arg-type]
        gpu_count=1,
        venv="/opt/opsctl/venv",
        python="python3",
        sglang_version="0.5.23",
        cuda=None,
        wheelhouse=None,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bastion", Endpoint("bastion", 22, "root")),
        ("ops@bastion", Endpoint("bastion", 22, "ops")),
        ("ops@bastion:2222", Endpoint("bastion", 2222, "ops")),
        ("10.1.2.3:2200", Endpoint("10.1.2.3", 2200, "root")),
    ],
)
def test_parse_jump(text: str, expected: Endpoint) -> None:
    assert Endpoint.parse_jump(text, "root") == expected


def test_known_hosts_name_brackets_non_default_ports() -> None:
    assert Endpoint("10.0.0.5", 22, "u").known_hosts_name == "10.0.0.5"
    assert Endpoint("10.0.0.5", 2222, "u").known_hosts_name == "[10.0.0.5]:2222"


def test_rsync_ssh_command_matches_the_paramiko_settings(tmp_path: Path) -> None:
    cfg = SshConfig(port=2222, connect_timeout=7.5, keepalive=20)
    argv = ssh_command(cfg, tmp_path / "kh", "/keys/id", None)
    text = " ".join(argv)
    assert argv[:3] == ["ssh", "-p", "2222"]
    for option in (
        "StrictHostKeyChecking=yes",
        f"UserKnownHostsFile={tmp_path / 'kh'}",
        "GlobalKnownHostsFile=/dev/null",
        "BatchMode=yes",
        "ConnectTimeout=7",
        "ServerAliveInterval=20",
        "IdentitiesOnly=yes",
    ):
        assert f"-o {option}" in text
    assert "-i /keys/id" in text


def test_rsync_ssh_command_through_a_jump_host(tmp_path: Path) -> None:
    argv = ssh_command(SshConfig(), tmp_path / "kh", "/keys/id", Endpoint("bastion", 2200, "ops"))
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert "-W %h:%p ops@bastion" in proxy and "-p 2200" in proxy
    assert "StrictHostKeyChecking=yes" in proxy and "-i /keys/id" in proxy


def test_rsync_errors_are_translated() -> None:
    assert isinstance(rsync_error("h", "rsync", 255, "Host key verification failed.\n"), HostKeyError)
    unreachable = rsync_error("h", "rsync", 255, "ssh: connect to host 1.2.3.4 port 22: Connection refused\n")
    assert isinstance(unreachable, UnreachableError)
    assert "Connection refused" in unreachable.one_line()
    other = rsync_error("h", "rsync", 23, "rsync: some files vanished\n")
    assert isinstance(other, RemoteError) and other.remote_exit_code == 23


def test_put_text_sends_content_on_stdin_never_argv() -> None:
    cmd = _put_text_cmd("/etc/opsctl/x.env", 0o600, "TOKEN=hunter2\n")
    assert "hunter2" not in cmd.shell()
    assert cmd.stdin == "TOKEN=hunter2\n"
    assert cmd.sudo
    assert cmd.argv[-2:] == ("/etc/opsctl/x.env", "600")
    assert "umask 077" in cmd.shell()


def test_strict_policy_refuses_unknown_keys(tmp_path: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(_keyfile(tmp_path))
    policy = _Policy(HostKeyPolicy.STRICT, tmp_path / "kh")
    with pytest.raises(_UnknownHostKey):
        policy.missing_host_key(paramiko.SSHClient(), "10.0.0.5", key)
    assert not (tmp_path / "kh").exists()


def test_accept_new_records_the_key(tmp_path: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(_keyfile(tmp_path))
    known = tmp_path / "sub" / "kh"
    client = paramiko.SSHClient()
    _Policy(HostKeyPolicy.ACCEPT_NEW, known).missing_host_key(client, "[10.0.0.5]:2222", key)
    assert known.read_text() == f"[10.0.0.5]:2222 ssh-ed25519 {key.get_base64()}\n"
    assert client.get_host_keys().lookup("[10.0.0.5]:2222") is not None


def test_changed_key_message_names_both_fingerprints(tmp_path: Path) -> None:
    old = paramiko.Ed25519Key.from_private_key_file(_keyfile(tmp_path, "a"))
    new = paramiko.Ed25519Key.from_private_key_file(_keyfile(tmp_path, "b"))
    reason = _host_key_reason(paramiko.BadHostKeyException("10.0.0.5", new, old), tmp_path / "kh")
    assert "CHANGED" in reason and new.fingerprint in reason and old.fingerprint in reason


def test_strict_without_known_hosts_file_is_a_host_key_error(tmp_path: Path) -> None:
    host = SshHost(_host(known_hosts_file=str(tmp_path / "missing"), connect_retries=1, connect_timeout=0.5))
    with pytest.raises(HostKeyError) as info:
        host.open()
    assert "does not exist" in info.value.one_line()


def test_nothing_listening_is_unreachable_after_retries(tmp_path: Path) -> None:
    known = tmp_path / "kh"
    known.write_text("")
    host = dataclasses.replace(
        _host(known_hosts_file=str(known), connect_retries=2, connect_timeout=0.5, port=1), address="127.0.0.1"
    )
    with pytest.raises(UnreachableError) as info:
        SshHost(host).open()
    assert "after 2 attempts" in info.value.one_line() and "connection refused" in info.value.one_line()


def _keyfile(tmp_path: Path, name: str = "k") -> str:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)


def test_an_authentication_timeout_is_retried_and_a_refused_key_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry policy alone (no network): paramiko raises AuthenticationException both when the host refuses the
    key and when it does not answer in time (a busy host, an sshd just booted); only the second is retried."""
    monkeypatch.setattr("opsctl.remote.ssh.BACKOFF_S", 0.01)
    connected = object()
    answers: list[Exception | object] = [paramiko.AuthenticationException("Authentication timeout."), connected]

    def connect_once(self: SshHost) -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(SshHost, "_connect_once", connect_once)
    host = SshHost(_host(connect_retries=3, connect_timeout=0.5))
    assert host._connect_with_retries() is connected and answers == []

    answers[:] = [paramiko.AuthenticationException("Authentication timeout.")] * 3
    with pytest.raises(UnreachableError) as info:
        host._connect_with_retries()
    assert "no answer to authentication within 0.5s (after 3 attempts)" in info.value.one_line()

    answers[:] = [paramiko.AuthenticationException("Authentication failed."), connected]
    with pytest.raises(UnreachableError) as info:
        host._connect_with_retries()
    assert "authentication failed for root@10.0.0.5" in info.value.one_line() and len(answers) == 1
