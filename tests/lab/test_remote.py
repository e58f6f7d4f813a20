"""opsctl.remote against real sshd/systemd hosts (the lab): parallelism, timeouts, Ctrl-C, host keys,
secrets, file transfer, and a host that dies mid-run (last: it restarts that host)."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.cli.common import to_jsonable
from opsctl.commands import Cmd, Masked, sh
from opsctl.errors import CommandTimeout, HostKeyError, RemoteError, UnreachableError
from opsctl.inventory.model import Host, HostKeyPolicy, Inventory
from opsctl.lab import LabConfig, cut_host, start_host, status, stop_host
from opsctl.remote import SecretOnCommandLine, SshHost, connect, run_parallel

pytestmark = pytest.mark.lab


def _ps(host: SshHost) -> str:
    return host.run(Cmd.of("ps", "-eo", "pid,pgid,args")).stdout


def _with_ssh(host: Host, **changes: object) -> Host:
    return dataclasses.replace(host, ssh=dataclasses.replace(host.ssh, **changes))


def test_commands_run_on_both_hosts_in_parallel(lab_inventory: Inventory) -> None:
    """Both workers hold their connection at once (a barrier a one-at-a-time pool never passes), then each host's
    command marks that it started and waits for a go file that the test writes only once both have started: the
    two runs overlap by construction (one at a time, the first would wait until its bound and fail). No clock is
    raced: a command that started late on a loaded machine still overlaps (the test slept 2 s in each command
    instead, and under load lab2's began after lab1's had ended)."""
    hosts = list(lab_inventory.hosts)
    both_connected = threading.Barrier(len(hosts), timeout=120)
    stamp = "date +%s.%N"
    started, go = "/root/opsctl-parallel.started", "/root/opsctl-parallel.go"
    wait_for_go = f"for i in $(seq 2400); do [ -e {go} ] && break; sleep 0.05; done; test -e {go}"  # <= 120 s

    def work(h: Host) -> tuple[str, float, float]:
        with connect(h) as remote:
            both_connected.wait()
            result = remote.run(sh(f"{stamp}; touch {started}; {wait_for_go}; hostname; {stamp}"))
        began, name, ended = result.stdout.split()
        return name, float(began), float(ended)

    watchers = [connect(h) for h in hosts]
    try:
        for watcher in watchers:
            watcher.run(Cmd.of("rm", "-f", started, go))
        with cf.ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_parallel, hosts, lambda h: h.name, work)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not running.done():
                if all(w.run(Cmd.of("test", "-e", started), check=False).exit_code == 0 for w in watchers):
                    break
                time.sleep(0.1)
            for watcher in watchers:  # both have started (or the bound passed): let them finish
                watcher.run(Cmd.of("touch", go))
            outcomes = running.result(timeout=300)
        for watcher in watchers:
            watcher.run(Cmd.of("rm", "-f", started, go))
    finally:
        for watcher in watchers:
            watcher.close()
    assert [o.host for o in outcomes] == ["lab1", "lab2"]
    assert [o.error for o in outcomes] == [None, None]
    runs = [o.value for o in outcomes if o.value]
    assert [r[0] for r in runs] == ["lab1", "lab2"]
    (_, began1, ended1), (_, began2, ended2) = runs  # the hosts share the control machine's clock
    assert began1 < ended2 and began2 < ended1, f"lab1 ran {began1}-{ended1}, lab2 {began2}-{ended2}: not at once"


def test_one_connection_is_reused(remotes: dict[str, SshHost]) -> None:
    """Every call goes over the same SSH connection: the host sees the same client port each time."""
    host = remotes["lab1"]
    ports = {host.run(sh("echo $SSH_CONNECTION")).stdout.split()[1] for _ in range(3)}
    assert len(ports) == 1
    assert host.run(Cmd.of("true")).ok


def test_small_packets_are_sent_at_once(remotes: dict[str, SshHost]) -> None:
    """TCP_NODELAY on the connection: without it each command waited ~40 ms for the host's delayed ACK."""
    host = remotes["lab1"]
    host.run(Cmd.of("true"))
    transport = host._transport()
    assert isinstance(transport.sock, socket.socket)
    assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_many_concurrent_commands_share_one_connection(remotes: dict[str, SshHost]) -> None:
    """More commands at once than sshd's MaxSessions (10): they queue on the connection, none fails."""
    host = remotes["lab1"]
    outcomes = run_parallel(list(range(20)), str, lambda i: host.run(sh(f"sleep 0.3; echo {i}")).stdout, forks=20)
    errors = [o.error.one_line() for o in outcomes if o.error is not None]
    assert [o.value for o in outcomes] == [f"{i}\n" for i in range(20)], errors


def test_exit_code_stdout_stderr_and_check(remotes: dict[str, SshHost]) -> None:
    host = remotes["lab1"]
    result = host.run(sh("echo out; echo err >&2; exit 3"), check=False)
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
    with pytest.raises(RemoteError) as info:
        host.run(sh("echo boom >&2; exit 4"))
    assert info.value.remote_exit_code == 4
    assert "boom" in info.value.one_line()
    stdin = host.run(Cmd.of("wc", "-c", stdin="x" * 100_000))
    assert stdin.stdout.strip() == "100000"


def test_timeout_is_reported_for_that_host_only_and_kills_the_command(lab_inventory: Inventory) -> None:
    marker = "31.4159"  # a sleep argument nothing else uses, to find it in ps

    def work(h: Host) -> str:
        with connect(h) as remote:
            cmd = sh(f"sleep {marker}") if h.name == "lab1" else sh("sleep 0.5; echo fine")
            return remote.run(cmd, timeout=1.5).stdout

    start = time.monotonic()
    outcomes = run_parallel(list(lab_inventory.hosts), lambda h: h.name, work)
    assert time.monotonic() - start < 20  # the stuck command sleeps 31 s
    by_host = {o.host: o for o in outcomes}
    assert isinstance(by_host["lab1"].error, CommandTimeout)
    assert "timed out after 1.5s" in by_host["lab1"].error.one_line()
    assert by_host["lab2"].error is None and by_host["lab2"].value == "fine\n"
    with connect(lab_inventory.host("lab1")) as remote:
        assert f"sleep {marker}" not in _ps(remote)


def test_ctrl_c_stops_cleanly_and_leaves_no_remote_process(lab_inventory: Inventory) -> None:
    marker = "42.4242"
    main = threading.get_ident()
    timer = threading.Timer(1.5, signal.pthread_kill, args=(main, signal.SIGINT))

    def work(h: Host) -> str:
        with connect(h) as remote:
            return remote.run(sh(f"sleep {marker} & sleep {marker}; wait")).stdout

    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_parallel(list(lab_inventory.hosts), lambda h: h.name, work)
    assert time.monotonic() - start < 20  # the stuck command sleeps 31 s
    for h in lab_inventory.hosts:
        with connect(h) as remote:
            assert f"sleep {marker}" not in _ps(remote), f"{h.name}: remote process left behind"


def test_ctrl_c_on_a_single_run_in_the_main_thread(remotes: dict[str, SshHost]) -> None:
    marker = "27.1828"
    host = remotes["lab2"]
    timer = threading.Timer(1.0, signal.pthread_kill, args=(threading.get_ident(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        host.run(sh(f"sleep {marker}"))
    assert f"sleep {marker}" not in _ps(host)


def test_changed_host_key_is_refused_with_a_clear_message(
    lab_inventory: Inventory, lab_config: LabConfig, tmp_path: Path
) -> None:
    real = lab_inventory.host("lab1")
    other = Path(lab_config.known_hosts).read_text().splitlines()[1].split(None, 1)[1]  # lab2's key
    forged = tmp_path / "known_hosts"
    forged.write_text(f"{real.address} {other}\n")
    with pytest.raises(HostKeyError) as info:
        connect(_with_ssh(real, known_hosts_file=str(forged))).run(Cmd.of("true"))
    message = info.value.one_line()
    assert "CHANGED" in message and real.address in message and str(forged) in message
    assert "known_hosts" in (info.value.hint or "")
    # accept-new never accepts a changed key either
    with pytest.raises(HostKeyError):
        connect(_with_ssh(real, known_hosts_file=str(forged), host_key_policy=HostKeyPolicy.ACCEPT_NEW)).run(
            Cmd.of("true")
        )


def test_unknown_host_key_refused_by_default_recorded_with_accept_new(
    lab_inventory: Inventory, lab_config: LabConfig, tmp_path: Path
) -> None:
    real = lab_inventory.host("lab2")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as info:
        connect(_with_ssh(real, known_hosts_file=str(empty))).run(Cmd.of("true"))
    assert "unknown host key" in info.value.one_line()
    with connect(_with_ssh(real, known_hosts_file=str(empty), host_key_policy=HostKeyPolicy.ACCEPT_NEW)) as h:
        assert h.run(Cmd.of("hostname")).stdout.strip() == "lab2"
    recorded = empty.read_text().split()
    expected = [line.split() for line in Path(lab_config.known_hosts).read_text().splitlines()]
    assert recorded in expected  # the same key the lab generated, for the same address
    with connect(_with_ssh(real, known_hosts_file=str(empty))) as h:  # strict now passes
        assert h.run(Cmd.of("true")).ok


def test_unreachable_port_is_reported_after_retries(lab_inventory: Inventory) -> None:
    host = _with_ssh(lab_inventory.host("lab1"), port=2222, connect_retries=2, connect_timeout=2.0)
    start = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        connect(host).run(Cmd.of("true"))
    assert "after 2 attempts" in info.value.one_line()
    assert time.monotonic() - start < 20  # two refused attempts (2 s timeout each) and the pause between them


def test_secret_never_in_process_list_logs_or_json(
    remotes: dict[str, SshHost], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    secret = "s3cr3t-" + secrets.token_hex(12)
    host = remotes["lab1"]
    # 1. put_text: a 0600 file, content over stdin
    host.put_text(f"API_KEY={secret}\n", "/root/opsctl-test.env", mode=0o600)
    stat = host.run(Cmd.of("stat", "-c", "%a %U", "/root/opsctl-test.env")).stdout.split()
    assert stat == ["600", "root"]
    assert host.get_text("/root/opsctl-test.env") == f"API_KEY={secret}\n"
    # 2. a command holding the secret (from stdin) while we look at the host's process list
    # it holds the secret until the test has looked (a release file), however slowly the host starts it
    release = "/root/opsctl-test.release"
    host.run(Cmd.of("rm", "-f", release))
    held = f'read -r s; until [ -e {release} ]; do sleep 0.1; done; [ -n "$s" ] && echo got'
    holder = Cmd.of("sh", "-c", held, stdin=secret + "\n")
    seen: dict[str, str] = {}
    thread = threading.Thread(target=lambda: seen.setdefault("out", host.run(holder).stdout))
    thread.start()
    deadline = time.monotonic() + 60
    ps = ""
    try:
        while f"until [ -e {release} ]" not in ps:  # we do look while it runs
            assert time.monotonic() < deadline, f"the holder never showed in ps:\n{ps}"
            ps = remotes["lab1"].run(Cmd.of("ps", "-eo", "args")).stdout
    finally:
        host.run(Cmd.of("touch", release))
        thread.join()
    assert secret not in ps
    assert seen["out"] == "got\n"
    # 3. a Masked argument is refused before anything is sent, and shows as ***
    with pytest.raises(SecretOnCommandLine) as info:
        host.run(Cmd.of("curl", "-H", Masked(f"Authorization: {secret}"), "http://x"))
    assert secret not in info.value.one_line() and "***" in info.value.one_line()
    # 4. results as --json would print them, and every log line
    result = host.run(holder)
    dumped = json.dumps(to_jsonable(result)) + repr(result) + repr(holder)
    assert secret not in dumped
    assert secret not in caplog.text
    host.run(Cmd.of("rm", "-f", "/root/opsctl-test.env", release))
    # 5. nor in the host's own logs (searched here, never by passing the secret to a remote grep)
    journal = host.run(Cmd.of("journalctl", "--no-pager", "-o", "cat", "--since", "-10min")).stdout
    assert secret not in journal and len(journal) > 0


def test_put_file_and_sync_dir_over_rsync(remotes: dict[str, SshHost], tmp_path: Path) -> None:
    host = remotes["lab2"]
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(3 * 1024 * 1024))
    host.put_file(blob, "/root/blob.bin", mode=0o640)
    remote = host.run(Cmd.of("sh", "-c", "sha256sum /root/blob.bin; stat -c %a /root/blob.bin")).stdout.split()
    assert remote[0] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert remote[-1] == "640"
    tree = tmp_path / "tree"
    (tree / "a/b").mkdir(parents=True)
    (tree / "a/b/c.txt").write_text("deep\n")
    (tree / "top.txt").write_text("top\n")
    host.sync_dir(tree, "/root/synced")
    assert host.get_text("/root/synced/a/b/c.txt") == "deep\n"
    assert host.get_text("/root/synced/top.txt") == "top\n"
    with pytest.raises(RemoteError):
        host.get_text("/root/does-not-exist")
    host.run(Cmd.of("rm", "-rf", "/root/synced", "/root/blob.bin"))


def test_jump_host_for_commands_and_rsync(lab_inventory: Inventory, tmp_path: Path) -> None:
    """lab2 reached through lab1: SSH_CONNECTION on lab2 shows lab1 as the client."""
    lab1, lab2 = lab_inventory.host("lab1"), lab_inventory.host("lab2")
    hop = _with_ssh(lab2, jump_host=f"root@{lab1.address}")
    with connect(hop) as remote:
        seen = remote.run(sh("hostname; echo $SSH_CONNECTION")).stdout.split()
        assert seen[0] == "lab2"
        assert seen[1] == lab1.address  # the client address lab2 saw
        local = tmp_path / "via-jump.txt"
        local.write_text("hop\n")
        remote.put_file(local, "/root/via-jump.txt")
        assert remote.get_text("/root/via-jump.txt") == "hop\n"
        remote.run(Cmd.of("rm", "-f", "/root/via-jump.txt"))


@pytest.fixture
def ops_user(remotes: dict[str, SshHost]) -> Iterator[str]:
    """A non-root user `ops` with passwordless sudo on lab1 (as on many real hosts)."""
    root = remotes["lab1"]
    root.run(
        sh(
            "id ops >/dev/null 2>&1 || useradd -m -s /bin/bash ops"
            " && install -d -m 700 -o ops -g ops /home/ops/.ssh"
            " && install -m 600 -o ops -g ops /root/.ssh/authorized_keys /home/ops/.ssh/authorized_keys"
            " && echo 'ops ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/ops && chmod 440 /etc/sudoers.d/ops"
        )
    )
    yield "ops"
    root.run(sh("pkill -u ops; rm -f /etc/sudoers.d/ops; userdel -r ops 2>/dev/null; true"))


def test_non_root_user_uses_sudo_for_privileged_work(
    ops_user: str, lab_inventory: Inventory, remotes: dict[str, SshHost], tmp_path: Path
) -> None:
    with connect(_with_ssh(lab_inventory.host("lab1"), user=ops_user)) as ops:
        assert ops.run(Cmd.of("id", "-un")).stdout.strip() == "ops"
        assert ops.run(Cmd.of("id", "-un", sudo=True)).stdout.strip() == "root"
        ops.put_text("K=V\n", "/etc/opsctl-sudo-test.env", mode=0o600)  # /etc: root only
        owner = remotes["lab1"].run(Cmd.of("stat", "-c", "%a %U", "/etc/opsctl-sudo-test.env")).stdout.split()
        assert owner == ["600", "root"]
        assert ops.get_text("/etc/opsctl-sudo-test.env") == "K=V\n"
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "f.txt").write_text("f\n")
        ops.sync_dir(tmp_path / "d", "/opt/opsctl-sudo-test")
        assert remotes["lab1"].get_text("/opt/opsctl-sudo-test/f.txt") == "f\n"
        marker = "23.2323"
        with pytest.raises(CommandTimeout):
            ops.run(Cmd.of("sleep", marker, sudo=True), timeout=1.0)
        assert f"sleep {marker}" not in _ps(remotes["lab1"])
    remotes["lab1"].run(Cmd.of("rm", "-rf", "/etc/opsctl-sudo-test.env", "/opt/opsctl-sudo-test"))


def test_silent_host_is_unreachable_within_two_keepalives(lab_inventory: Inventory, lab_config: LabConfig) -> None:
    """A host that stops answering mid-command without closing the connection (its network cut: no RST, as a
    hung host or a partition) is reported unreachable two keepalive intervals later, not at the command's
    timeout; a command that prints nothing for longer on a live host is not."""
    host = _with_ssh(lab_inventory.host("lab2"), keepalive=3, connect_retries=3, connect_timeout=3.0)
    with connect(host) as remote:
        assert remote.run(sh("sleep 8; echo done"), timeout=30).stdout == "done\n"  # silent, alive: probes answered
        cutter = threading.Timer(1.0, cut_host, args=(lab_config, "lab2"))
        cutter.start()
        started = time.monotonic()
        try:
            with pytest.raises(UnreachableError, match=r"no answer for [0-9]+ s during `sleep 60`") as caught:
                remote.run(Cmd.of("sleep", "60"), timeout=120)
            took = time.monotonic() - started
            # the call that follows at once (a deploy releasing its lock) is told at once, not after a silent
            # reconnect with retries (3 x 3 s here; 17 s in the lab's inventory, after 30 s of detection)
            again = time.monotonic()
            with pytest.raises(UnreachableError, match=r"found dead \(no answer for [0-9]+ s.*not reconnecting yet"):
                remote.run(Cmd.of("true"))
            followed = time.monotonic() - again
        finally:
            cutter.join()
            cut_host(lab_config, "lab2", cut=False)
    assert took < 12, f"reported after {took:.1f} s"  # cut at 1 s; probe at ~3 s; gone at ~6 s
    assert followed < 1, f"the next call was told after {followed:.1f} s"
    assert "network to it is cut" in (caught.value.hint or "")
    with connect(lab_inventory.host("lab2")) as remote:  # the link back: a new connection works
        assert remote.run(Cmd.of("hostname")).stdout.strip() == "lab2"


def test_zz_host_stopped_mid_run_is_unreachable_while_the_other_succeeds(
    lab_inventory: Inventory, lab_config: LabConfig
) -> None:
    """Last in this module: it kills lab2's container, then boots it again."""

    def work(h: Host) -> str:
        with connect(h) as remote:
            return remote.run(sh("sleep 4; echo done"), timeout=30).stdout

    killer = threading.Timer(1.5, stop_host, args=(lab_config, "lab2"), kwargs={"kill": True})
    killer.start()
    try:
        outcomes = run_parallel(list(lab_inventory.hosts), lambda h: h.name, work)
    finally:
        killer.join()
    by_host = {o.host: o for o in outcomes}
    assert by_host["lab1"].value == "done\n"
    assert isinstance(by_host["lab2"].error, UnreachableError), by_host["lab2"].error
    assert {h.name: h.state for h in status(lab_config).hosts}["lab2"] == "stopped"
    with pytest.raises(UnreachableError):
        connect(_with_ssh(lab_inventory.host("lab2"), connect_retries=1, connect_timeout=2.0)).run(Cmd.of("true"))
    start_host(lab_config, "lab2")
    with connect(lab_inventory.host("lab2")) as remote:
        assert remote.run(Cmd.of("hostname")).stdout.strip() == "lab2"
