"""The lab itself: real systemd hosts with sshd and journald, status, inventory, and a complete `down`."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from opsctl.commands import Cmd, sh
from opsctl.errors import LabError
from opsctl.inventory.model import Inventory
from opsctl.lab import LabConfig, LabReport, down, status, up
from opsctl.lab import state as lab_state
from opsctl.remote import SshHost

pytestmark = pytest.mark.lab


def test_hosts_boot_systemd_with_ssh_and_journald(remotes: dict[str, SshHost]) -> None:
    for name, host in remotes.items():
        assert host.run(Cmd.of("hostname")).stdout.strip() == name
        state = host.run(Cmd.of("systemctl", "is-system-running"), check=False).stdout.strip()
        assert state in ("running", "degraded")
        assert host.run(Cmd.of("systemctl", "is-active", "ssh")).stdout.strip() == "active"
        journal = host.run(Cmd.of("journalctl", "-u", "ssh", "-n", "20", "--no-pager")).stdout
        assert "sshd" in journal
        assert host.run(Cmd.of("python3", "-c", "import venv, sys; print(sys.version_info[0])")).stdout == "3\n"
        # a service sees the lab's manager defaults (opsctl.lab.machine.MANAGER_DROP_IN): one CPU thread
        seen = host.run(Cmd.of("systemd-run", "--wait", "--pipe", "--quiet", "printenv", "OMP_NUM_THREADS")).stdout
        assert seen == "1\n"


def test_hosts_have_a_sized_writable_dev_shm(remotes: dict[str, SshHost]) -> None:
    host = remotes["lab1"]
    fields = host.run(Cmd.of("df", "-B1", "--output=fstype,size,avail", "/dev/shm")).stdout.split()
    assert fields[3] == "tmpfs"
    size, avail = int(fields[4]), int(fields[5])
    assert size == 2 * 1024**3  # LabConfig.shm_size
    host.run(sh("head -c 50000000 /dev/zero > /dev/shm/opsctl-fill"))
    after = int(host.run(Cmd.of("df", "-B1", "--output=avail", "/dev/shm")).stdout.split()[1])
    assert avail - after >= 50_000_000
    full = host.run(Cmd.of("fallocate", "-l", "3G", "/dev/shm/opsctl-fill2"), check=False)
    assert full.exit_code != 0 and "No space left" in full.stderr
    host.run(Cmd.of("rm", "-f", "/dev/shm/opsctl-fill", "/dev/shm/opsctl-fill2"))


def test_hosts_reach_only_the_lab_network(remotes: dict[str, SshHost], lab_config: LabConfig) -> None:
    routes = json.loads(remotes["lab2"].run(Cmd.of("ip", "-j", "route")).stdout)
    assert [r["dst"] for r in routes] == [str(lab_config.subnet)]  # no default route: no internet
    lab1 = remotes["lab1"].run(Cmd.of("hostname", "-I")).stdout.split()[0]
    assert _probe(remotes["lab2"], lab1, 22) == "open"  # hosts see each other on the lab bridge
    assert _probe(remotes["lab2"], str(lab_config.gateway), 1) == "refused"  # the control machine answers
    assert _probe(remotes["lab2"], "192.0.2.1", 22) == "unroutable"  # nothing outside the lab is routed


PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("unroutable" if exc.errno == 101 else f"other {exc}")
"""


def _probe(host: SshHost, address: str, port: int) -> str:
    return host.run(Cmd.of("python3", "-c", PROBE, address, str(port))).stdout.strip()


def test_status_and_inventory_describe_the_running_lab(
    lab_hosts: LabReport, lab_config: LabConfig, lab_inventory: Inventory
) -> None:
    report = status(lab_config)
    assert [(h.name, h.state, h.ssh) for h in report.hosts][:2] == [
        ("lab1", "running", True),
        ("lab2", "running", True),
    ]
    addresses = {h.name: h.address for h in report.hosts}
    assert {h.name: h.address for h in lab_inventory.hosts} == addresses
    assert all(ipaddress.ip_address(a) in lab_config.subnet for a in addresses.values())
    lab1 = lab_inventory.host("lab1")
    assert lab1.ssh.known_hosts_file == str(lab_config.known_hosts)
    assert lab1.ssh.host_key_policy.value == "strict"
    assert [s.engine.value for s in lab1.services] == ["reference"]
    known = Path(lab_config.known_hosts).read_text().split("\n")
    assert [line.split()[0] for line in known if line][:2] == [addresses["lab1"], addresses["lab2"]]


def test_cli_status_json(lab_hosts: LabReport, lab_config: LabConfig) -> None:
    from opsctl.cli.lab import _config

    if lab_config.state_dir != _config().state_dir:
        pytest.skip("`opsctl lab` looks at the default lab or OPSCTL_LAB_SLOT's, not at this part's own lab")
    proc = subprocess.run(["opsctl", "lab", "status", "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [(h["name"], h["state"], h["ssh"]) for h in data["hosts"]][:2] == [
        ("lab1", "running", True),
        ("lab2", "running", True),
    ]
    assert data["subnet"] == str(lab_config.subnet)


def test_up_again_keeps_running_hosts(lab_hosts: LabReport, lab_config: LabConfig) -> None:
    pids = {h.name: h.pid for h in status(lab_config).hosts}
    again = up(lab_config, 2)
    assert again.started == ()
    assert again.rootfs_build_s is None
    assert {h.name: h.pid for h in again.hosts} == pids


def test_a_running_lab_keeps_its_subnet(lab_hosts: LabReport, lab_config: LabConfig) -> None:
    other = dataclasses.replace(lab_config, subnet=ipaddress.IPv4Network("10.218.0.0/24"))
    with pytest.raises(LabError) as info:
        up(other, 2)
    subnet = lab_config.subnet
    assert info.value.one_line() == (
        f"a lab is already running on {subnet} (use --subnet {subnet}, or run `opsctl lab down` first)"
    )
    assert [h.state for h in status(lab_config).hosts][:2] == ["running", "running"]


def test_subnet_colliding_with_a_route_is_refused(lab_hosts: LabReport, tmp_path: Path) -> None:
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route"], capture_output=True, text=True).stdout)
    taken = next(r["dst"] for r in routes if r.get("dst") not in (None, "default") and "/" in r["dst"])
    cfg = _isolated(tmp_path, subnet=ipaddress.IPv4Network(taken, strict=False), prefix="olabc")
    with pytest.raises(LabError) as info:
        up(cfg, 1)
    assert "collides with existing route" in info.value.one_line() and "--subnet" in (info.value.hint or "")
    assert not cfg.state_file.exists() or not lab_state.load(cfg)


def _isolated(tmp_path: Path, **changes: object) -> LabConfig:
    """A second lab that cannot touch the session's: own names, subnet, dirs (shares the rootfs cache)."""
    base = LabConfig(
        subnet=ipaddress.IPv4Network("10.214.0.0/24"),
        root_dir=tmp_path / "root",
        state_dir=tmp_path / "state",
        inventory_path=tmp_path / "lab.yaml",
        prefix="olabt",
    )
    return dataclasses.replace(base, **changes)


def _leftovers(cfg: LabConfig) -> dict[str, list[str]]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if "systemd-nspawn" in cmdline and str(cfg.root_dir) in cmdline and stat[0] != "Z":
            procs.append(f"{entry.name} {cmdline}")
    hosts_dir = cfg.hosts_dir
    return {
        "netns": [n for n in netns if n.startswith(cfg.prefix)],
        "links": [lk["ifname"] for lk in links if lk["ifname"].startswith(cfg.prefix)],
        "mounts": [m for m in mounts if str(cfg.root_dir) in m],
        "nspawn": procs,
        "dirs": [str(p) for p in hosts_dir.iterdir()] if hosts_dir.exists() else [],
        "state": [str(cfg.state_file)] if cfg.state_file.exists() else [],
        "inventory": [str(cfg.inventory_path)] if cfg.inventory_path.exists() else [],
    }


NOTHING = {"netns": [], "links": [], "mounts": [], "nspawn": [], "dirs": [], "state": [], "inventory": []}


def test_down_leaves_no_namespace_veth_process_or_mount(lab_hosts: LabReport, tmp_path: Path) -> None:
    cfg = _isolated(tmp_path)
    report = up(cfg, 1)
    assert report.rootfs_build_s is None  # the cache is shared with the session's lab
    # nothing rebuilt (rootfs or tiny models: minutes each here), so `up` is the host's boot, which `up` itself
    # bounds by boot_timeout; a fixed 30 s budget failed on a loaded machine
    assert report.up_s is not None and 0 < report.up_s < cfg.boot_timeout
    made = _leftovers(cfg)
    assert made["netns"] == ["olabt-lab1"] and set(made["links"]) == {"olabt0", "olabt-lab1"}
    assert len(made["mounts"]) == 1 and len(made["nspawn"]) == 1 and made["inventory"]
    assert down(cfg) == ["lab1"]
    assert _leftovers(cfg) == NOTHING
    assert down(cfg) == []  # idempotent
    assert _leftovers(cfg) == NOTHING


def _wait_dead(pid: int, timeout: float = 30.0) -> None:
    """Until `pid` is gone or a zombie (killed, not yet reaped): the kill has landed, however loaded the CPU."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        assert time.monotonic() < deadline, f"pid {pid} still {state} {timeout}s after SIGKILL"
        time.sleep(0.05)


def test_down_after_a_crash_that_lost_the_state(lab_hosts: LabReport, tmp_path: Path) -> None:
    """opsctl and nspawn killed hard and the state file gone: down still finds and removes everything."""
    cfg = _isolated(tmp_path, prefix="olabk", subnet=ipaddress.IPv4Network("10.215.0.0/24"))
    up(cfg, 1)
    record = lab_state.load(cfg).hosts["lab1"]  # type: ignore[union-attr]
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    _wait_dead(record.pid)
    cfg.state_file.unlink()
    assert down(cfg) == ["lab1"]
    leftovers = _leftovers(cfg)
    leftovers["inventory"] = []  # without the state, down cannot know where the inventory was written
    assert leftovers == NOTHING
