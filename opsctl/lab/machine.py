"""One lab host: its overlay root, identity, container process, readiness and teardown.

The container is `systemd-nspawn -b` in its own session (setsid) inside the host's network namespace; its PID
and start time go into the lab state so `down` can stop exactly it, even from another process after a crash.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import LabError, OpsctlError
from opsctl.inventory.model import Host, HostKeyPolicy, SshConfig
from opsctl.lab import keys, net, system
from opsctl.lab.config import LabConfig
from opsctl.lab.state import HostRecord
from opsctl.remote.ssh import SshHost

# Containers started by this process, kept so the Popen objects are not collected while running (that warns)
# and so their exit status is collected (else they linger as zombies while this process lives).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}

STOP_GRACE_S = 15.0  # a clean poweroff takes about 1-2 s
READY_STATES = ("running", "degraded")


def overlay_dirs(record: HostRecord) -> tuple[Path, Path, Path]:
    base = Path(record.dir)
    return base / "upper", base / "work", base / "root"


def prepare(cfg: LabConfig, record: HostRecord, rootfs: Path) -> HostRecord:
    """Mount the overlay (cached rootfs below, per-host upper) and give the host its identity."""
    upper, work, root = overlay_dirs(record)
    fresh = not upper.exists()
    for d in (upper, work, root):
        d.mkdir(parents=True, exist_ok=True)
    if not is_mounted(root):
        system.run(
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={rootfs},upperdir={upper},workdir={work}",
            str(root),
        )
    write_manager_defaults(root)
    if fresh or not record.host_key:
        (root / "etc/hostname").write_text(record.name + "\n")
        (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{record.address} {record.name}\n")
        keys.install_authorized_key(root, keys.client_public_key(cfg))
        record = replace(record, host_key=keys.make_host_key(root / "etc/ssh", record.name))
    return record


# Every lab host shares the control machine's few cores with the other hosts (and, in CI, with the test tiers).
# torch's CPU thread pool spins while it waits for work: on a 2-core box a reference server at its default
# 2 threads used twice the CPU of one thread for the same tokens per second (measured in docs/ci.md).
# So the lab's services run one OpenMP/MKL thread, the way a small CPU host would be set up; a real GPU host
# is not touched (this is the lab's systemd, not opsctl's unit).
MANAGER_DROP_IN = """\
# opsctl lab: hosts share the control machine's cores; one CPU thread per service process
[Manager]
DefaultEnvironment=OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
"""


def write_manager_defaults(root: Path) -> None:
    """The systemd manager defaults every lab service starts with (written on each start: no rootfs rebuild)."""
    conf_dir = root / "etc/systemd/system.conf.d"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "opsctl-lab.conf").write_text(MANAGER_DROP_IN)


def spawn(cfg: LabConfig, record: HostRecord) -> HostRecord:
    """Boot the container detached; returns the record with its pid."""
    _, _, root = overlay_dirs(record)
    console = (Path(record.dir) / "console.log").open("ab")
    argv = [
        "systemd-nspawn",
        "--boot",
        f"--directory={root}",
        f"--machine={record.netns}",
        "--register=no",
        "--keep-unit",
        "--link-journal=no",
        f"--network-namespace-path=/run/netns/{record.netns}",
        f"--tmpfs=/dev/shm:mode=1777,size={cfg.shm_size}",
    ]
    with console:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session and process group: no terminal signal reaches it
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    return replace(record, pid=proc.pid, start_time=start_time(proc.pid))


def wait_ready(cfg: LabConfig, record: HostRecord, deadline: float) -> None:
    """Until sshd answers and `systemctl is-system-running` says running or degraded."""
    last = "no answer"
    while time.monotonic() < deadline:
        if not is_running(record):
            raise LabError(f"{record.name}: the container exited during boot: {console_tail(record)}")
        if port_open(record.address, 22):
            try:
                with SshHost(ssh_host(cfg, record, connect_timeout=3.0)) as host:
                    remaining = max(1.0, deadline - time.monotonic())
                    result = host.run(Cmd.of("systemctl", "is-system-running", "--wait"), remaining, check=False)
                state = result.stdout.strip()
                if state in READY_STATES:
                    return
                last = f"systemctl is-system-running: {state or result.stderr.strip()}"
            except OpsctlError as exc:
                last = exc.one_line()
        time.sleep(0.2)
    raise LabError(f"{record.name}: not ready after {cfg.boot_timeout:g}s ({last})", "see `opsctl lab status`")


def ssh_host(cfg: LabConfig, record: HostRecord, connect_timeout: float = 5.0) -> Host:
    """An inventory Host for the lab host (what inventory/lab.yaml describes), for opsctl.remote."""
    return Host(
        name=record.name,
        address=record.address,
        ssh=SshConfig(
            user="root",
            key_file=str(cfg.key_file),
            known_hosts_file=str(cfg.known_hosts),
            host_key_policy=HostKeyPolicy.STRICT,
            connect_timeout=connect_timeout,
            connect_retries=1,
        ),
        gpu_count=0,
        venv="/opt/opsctl/venv",
        python="python3",
        sglang_version="0.5.23",
        cuda=None,
        wheelhouse=None,
    )


def stop(record: HostRecord, kill: bool = False) -> None:
    """Stop the container: SIGTERM to nspawn (a clean poweroff), or SIGKILL everything at once with kill=True
    (a crash, as seen from the network). Then no process is left in the host's namespace."""
    if is_running(record) and record.pid is not None:
        if kill:
            _signal_netns(record.netns, signal.SIGKILL)
            os.kill(record.pid, signal.SIGKILL)
        else:
            os.kill(record.pid, signal.SIGTERM)
        _wait_gone(record, STOP_GRACE_S)
    if is_running(record) and record.pid is not None:
        os.kill(record.pid, signal.SIGKILL)
    # An nspawn killed hard leaves the container's init orphaned: everything in the namespace goes.
    for _ in range(50):
        if not net.netns_pids(record.netns):
            break
        _signal_netns(record.netns, signal.SIGKILL)
        time.sleep(0.1)
    _reap(record.pid)


def destroy(record: HostRecord) -> None:
    """Remove everything of one host (after stop): mount, namespace, veth, per-host directory."""
    _, _, root = overlay_dirs(record)
    if is_mounted(root) and not system.ok("umount", str(root)):
        system.run("umount", "--lazy", str(root))
    net.remove_host_net(record.netns, record.veth)
    if is_mounted(root):
        raise LabError(f"{record.name}: {root} is still mounted", "unmount it, then run `opsctl lab down` again")
    shutil.rmtree(record.dir, ignore_errors=True)
    shutil.rmtree(f"/run/systemd/nspawn/propagate/{record.netns}", ignore_errors=True)


def is_running(record: HostRecord) -> bool:
    """Our nspawn process is alive (same pid and start time; zombies count as gone)."""
    if record.pid is None:
        return False
    _reap(record.pid)
    stat = _stat(record.pid)
    return stat is not None and stat[0] != "Z" and int(stat[19]) == record.start_time


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return int(stat[19]) if stat else None


def console_tail(record: HostRecord, lines: int = 3) -> str:
    try:
        text = (Path(record.dir) / "console.log").read_text(errors="replace")
    except OSError:
        return "no console log"
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after the command name: [state, ppid, ...]; field 22 (starttime) is [19]."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _signal_netns(netns: str, sig: signal.Signals) -> None:
    for pid in net.netns_pids(netns):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(record: HostRecord, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while is_running(record) and time.monotonic() < deadline:
        time.sleep(0.1)


def _reap(pid: int | None) -> None:
    """If this process started the container, collect its exit status (else it lingers as a zombie)."""
    if pid is None:
        return
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _CHILDREN[pid]
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError as exc:
        if exc.errno != errno.ECHILD:
            raise


def port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False
