"""An unreachable host is one line on stderr for every command that connects, never paramiko's traceback.
Real paramiko against a real socket that is not sshd (it answers HTTP and closes): the handshake
fails inside paramiko's transport thread, which logs the traceback itself unless opsctl quiets it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

COMMANDS = [["status"], ["logs"], ["rollback", "--plan"], ["provision", "--plan"]]


@pytest.fixture(scope="module")
def not_sshd() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def _inventory(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(
        "hosts:\n  ghost:\n    address: 127.0.0.1\n"
        f"    ssh: {{port: {port}, user: root, host_key_policy: accept-new, known_hosts_file: {tmp_path}/kh,"
        " connect_retries: 1, connect_timeout: 5}\n"
        "    services:\n      ref:\n        engine: reference\n        mode: baseline\n        port: 31004\n"
        "        device: cpu\n        model: {source: /data/m, source_on: host, path: /dev/shm/m}\n"
    )
    return path


def test_unreachable_host_is_one_line_for_every_command(tmp_path: Path, not_sshd: int) -> None:
    inv = _inventory(tmp_path, not_sshd)
    code = "import sys; sys.argv[0] = 'opsctl'; from opsctl.cli.app import main; main()"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)}
    argvs = [[sys.executable, "-c", code, *cmd, "-i", str(inv)] for cmd in COMMANDS]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for a in argvs]
    for cmd, proc in zip(COMMANDS, procs, strict=True):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, (cmd, err)
        assert "Traceback" not in err and "paramiko" not in err, (cmd, err)
        said = [line for line in err.splitlines() if "unreachable" in line]
        assert len(said) == 1 and "Error reading SSH protocol banner" in said[0], (cmd, err)
        assert "ghost: ghost:" not in err, (cmd, err)  # the host named once
        assert "ghost/ref: ghost:" not in err, (cmd, err)  # nor after a service's label


class Silent:
    """A host whose port takes connections and never says a word (sshd hung, or a firewall that holds them)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                self.held.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


def test_status_on_a_silent_host_costs_one_connect_timeout(tmp_path: Path) -> None:
    """`status` on an unreachable host took 34 s: every connect retry waited a full timeout, and the
    orphan-router pass connected to the same host again (connect_timeout 10 s, connect_retries 3 on a silent
    port: 69 s before, 15.7 s now). Here connect_timeout 1 s, connect_retries 3: one connection, not 6."""
    host = Silent()
    inv = tmp_path / "inv.yaml"
    text = _inventory(tmp_path, host.port).read_text()
    inv.write_text(text.replace("connect_retries: 1, connect_timeout: 5", "connect_retries: 3, connect_timeout: 1"))
    code = "import sys; sys.argv[0] = 'opsctl'; from opsctl.cli.app import main; main()"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path)}
    try:
        out = subprocess.run([sys.executable, "-c", code, "status", "-i", str(inv)], capture_output=True, text=True,
                             env=env, timeout=120)  # fmt: skip
    finally:
        host.close()
    assert out.returncode == 1
    said = [line for line in out.stderr.splitlines() if "unreachable" in line]
    assert len(said) == 1 and said[0].startswith("ghost: unreachable: ") and "(after 1 attempt)" in said[0], said
    assert len(host.held) == 1
