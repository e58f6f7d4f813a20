"""`lab prepare`, `lab up`, `lab status`, `lab down`: the whole lab's lifecycle over
machine/net/keys/rootfs/state."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from opsctl.errors import LabError
from opsctl.lab import inventory, keys, machine, models, net, rootfs, state, system
from opsctl.lab.config import LabConfig, host_name
from opsctl.lab.state import HostRecord, LabState
from opsctl.progress import Ticker
from opsctl.remote.pool import run_parallel


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    state: str  # "running" | "stopped"
    ssh: bool  # port 22 answers
    pid: int | None


@dataclass(frozen=True)
class LabReport:
    subnet: str
    hosts: tuple[HostStatus, ...]
    inventory: str
    known_hosts: str
    key_file: str
    rootfs: str = ""
    rootfs_build_s: float | None = None  # None: the cached rootfs was used
    started: tuple[str, ...] = ()  # hosts booted by this call
    up_s: float | None = None  # wall time of `up`


@dataclass(frozen=True)
class Prepared:
    """What `prepare` found or built: each part's cache, and how long a build took (None: it was cached)."""

    rootfs: str = ""  # "" when not asked for
    rootfs_build_s: float | None = None
    models: str = ""
    models_build_s: float | None = None


def prepare(cfg: LabConfig, rootfs_part: bool = True, models_part: bool = True) -> Prepared:
    """Build the lab's caches without booting a host: the rootfs and the tiny models, at once.

    The tiny models' training is CPU-bound on one thread; the rootfs build is downloads and dpkg, on the other
    core of a 2-core machine. `up` builds what is missing the same way; `scripts/setup` calls this while pip
    still installs, so a fresh machine's first `lab up` finds both built."""
    if rootfs_part:
        system.preflight()
    with ThreadPoolExecutor(1, thread_name_prefix="tiny-models") as pool:
        tiny = pool.submit(_timed_models) if models_part else None
        root, build_s = rootfs.ensure(cfg) if rootfs_part else (None, None)
        models_s = tiny.result() if tiny is not None else None
    return Prepared(
        rootfs=str(root or ""),
        rootfs_build_s=build_s,
        models=str(models.lab_models_dir()) if models_part else "",
        models_build_s=models_s,
    )


def _timed_models() -> float | None:
    """Seconds the tiny models' build took; None when the cache was current."""
    start = time.monotonic()
    return time.monotonic() - start if models.ensure_tiny_models() else None


def up(cfg: LabConfig, count: int) -> LabReport:
    """Make hosts lab1..labN run (idempotent: running hosts are kept, stopped ones restarted)."""
    if count < 1:
        raise LabError(f"--hosts must be at least 1, got {count}")
    system.preflight()
    begin = time.monotonic()
    with state.locked(cfg):
        current = state.load(cfg)
        if current is not None and current.hosts and current.subnet != str(cfg.subnet):
            raise LabError(
                f"a lab is already running on {current.subnet}",
                f"use --subnet {current.subnet}, or run `opsctl lab down` first",
            )
        for index in range(1, count + 1):
            cfg.address(index)  # raises if N hosts do not fit the subnet
        net.check_subnet(cfg)
        # The tiny models (CPU-bound training) build while the rootfs downloads and the hosts boot: on a fresh
        # machine that overlaps about a minute of each. A failure below still waits for the build (kept for
        # the next run).
        with ThreadPoolExecutor(1, thread_name_prefix="tiny-models") as pool:
            tiny = pool.submit(models.ensure_tiny_models)
            root, build_s = rootfs.ensure(cfg)
            if current is not None and current.hosts and current.rootfs and Path(current.rootfs).is_dir():
                root = Path(current.rootfs)  # running hosts sit on that lower layer: keep one per lab
            st = current or LabState(subnet=str(cfg.subnet), bridge=cfg.bridge)
            st = replace(st, rootfs=str(root), inventory=str(cfg.inventory_path.resolve()))
            state.save(cfg, st)
            keys.ensure_client_key(cfg)
            net.ensure_bridge(cfg)
            st, started = _boot_all(cfg, st, root, count)
            tiny.result()
        inventory.write(cfg, st.hosts.values())
        return _report(cfg, st, build_s, tuple(r.name for r in started), time.monotonic() - begin)


def _boot_all(cfg: LabConfig, st: LabState, root: Path, count: int) -> tuple[LabState, list[HostRecord]]:
    """Boot lab1..labN where not running and wait until every booted one is ready; (new state, booted)."""
    started: list[HostRecord] = []
    with Ticker("lab up") as ticker:
        for index in range(1, count + 1):
            record = st.hosts.get(host_name(index)) or _new_record(cfg, index)
            if machine.is_running(record):
                continue
            ticker.update(f"booting {record.name}")
            st = _boot(cfg, st, record, root)
            started.append(st.hosts[record.name])
        deadline = time.monotonic() + cfg.boot_timeout
        ready: list[str] = []
        ticker.update(f"waiting for systemd and sshd on {', '.join(r.name for r in started)}")

        def wait(record: HostRecord) -> None:
            machine.wait_ready(cfg, record, deadline)
            ready.append(record.name)
            ticker.update(f"ready: {', '.join(sorted(ready))}")

        outcomes = run_parallel(started, lambda r: r.name, wait)
    failed = [o.error for o in outcomes if o.error is not None]
    if failed:
        raise LabError("; ".join(e.one_line() for e in failed), "see `opsctl lab status`; `opsctl lab down` cleans up")
    return st, started


def start_host(cfg: LabConfig, name: str) -> None:
    """Boot one stopped host again (same identity and disk) and wait until it is ready."""
    system.preflight()
    with state.locked(cfg):
        st = _require_state(cfg)
        record = _require_host(st, name)
        if machine.is_running(record):
            return
        st = _boot(cfg, st, record, Path(st.rootfs))
        machine.wait_ready(cfg, st.hosts[name], time.monotonic() + cfg.boot_timeout)


def stop_host(cfg: LabConfig, name: str, kill: bool = False) -> None:
    """Stop one host's container (kill=True: at once, like a power cut); its disk and network stay."""
    system.preflight()
    with state.locked(cfg):
        machine.stop(_require_host(_require_state(cfg), name), kill=kill)


def cut_host(cfg: LabConfig, name: str, cut: bool = True) -> None:
    """Cut one running host off the network (cut=False: reconnect it). Its processes and connections stay, and
    nothing answers: a hung host or a partition, as seen from the control machine."""
    system.preflight()
    with state.locked(cfg):
        net.set_link(_require_host(_require_state(cfg), name).veth, up=not cut)


def remove_host(cfg: LabConfig, name: str) -> None:
    """Stop and delete one host (disk included); the rest of the lab stays."""
    system.preflight()
    with state.locked(cfg):
        st = _require_state(cfg)
        record = _require_host(st, name)
        machine.stop(record)
        machine.destroy(record)
        st = st.without_host(name)
        state.save(cfg, st)
        keys.write_known_hosts(cfg, st.hosts.values())
        if st.inventory:
            inventory.write(replace(cfg, inventory_path=Path(st.inventory)), st.hosts.values())


def status(cfg: LabConfig) -> LabReport:
    st = state.load(cfg)
    if st is None:
        return LabReport(str(cfg.subnet), (), "", str(cfg.known_hosts), str(cfg.key_file))
    return _report(cfg, st, None, (), None)


def down(cfg: LabConfig) -> list[str]:
    """Remove every container, namespace, veth, mount and per-host directory of the lab; idempotent.

    Works from the state file and also from what it finds (namespaces and directories named like the lab's),
    so a crash between creating a resource and recording it leaves nothing behind. Keeps the rootfs cache
    and the lab client key. Returns what it removed.
    """
    system.preflight()
    removed: list[str] = []
    with state.locked(cfg):
        st = state.load(cfg)
        records = dict(st.hosts) if st else {}
        for found in _leftovers(cfg, records):
            records[found.name] = found
        ordered = sorted(records.values(), key=lambda r: r.index)
        run_parallel(ordered, lambda r: r.name, machine.stop)  # clean poweroffs, ~1-2 s each, all at once
        for record in ordered:
            machine.stop(record)  # a no-op unless the parallel stop failed
            machine.destroy(record)
            removed.append(record.name)
        for link in net.lab_links(cfg):
            if link != cfg.bridge:
                system.ok("ip", "link", "del", link)
        net.remove_bridge(cfg)
        cfg.known_hosts.unlink(missing_ok=True)
        if st is not None and st.inventory:
            inventory.remove(st.inventory)
        state.remove(cfg)
    return removed


def _boot(cfg: LabConfig, st: LabState, record: HostRecord, root: Path) -> LabState:
    """Record first, then create: a crash at any point leaves a state `down` can clean."""
    machine.stop(record)  # leftovers of a crashed container in this namespace, if any
    st = st.with_host(record)
    state.save(cfg, st)
    net.create_host_net(cfg, record.netns, record.veth, record.address)
    record = machine.prepare(cfg, record, root)
    st = st.with_host(record)
    state.save(cfg, st)
    keys.write_known_hosts(cfg, st.hosts.values())
    record = machine.spawn(cfg, record)
    st = st.with_host(record)
    state.save(cfg, st)
    return st


def _new_record(cfg: LabConfig, index: int) -> HostRecord:
    name = host_name(index)
    return HostRecord(
        name=name,
        index=index,
        address=str(cfg.address(index)),
        netns=cfg.netns(name),
        veth=cfg.netns(name),
        dir=str(cfg.hosts_dir / name),
    )


def _leftovers(cfg: LabConfig, known: dict[str, HostRecord]) -> list[HostRecord]:
    """Lab hosts that exist on this machine but not in the state file (crash before it was written)."""
    names = {ns.removeprefix(f"{cfg.prefix}-") for ns in net.lab_netns(cfg)}
    if cfg.hosts_dir.is_dir():
        names |= {d.name for d in cfg.hosts_dir.iterdir() if d.is_dir()}
    found = []
    for name in sorted(names - set(known)):
        index = int(name[3:]) if name.startswith("lab") and name[3:].isdigit() else 0
        found.append(HostRecord(name, index, "", cfg.netns(name), cfg.netns(name), str(cfg.hosts_dir / name)))
    return found


def _require_state(cfg: LabConfig) -> LabState:
    st = state.load(cfg)
    if st is None:
        raise LabError("no lab is running", "run `opsctl lab up --hosts 2`")
    return st


def _require_host(st: LabState, name: str) -> HostRecord:
    if name not in st.hosts:
        raise LabError(f"no lab host named {name}", f"lab hosts: {', '.join(st.hosts) or 'none'}")
    return st.hosts[name]


def _report(
    cfg: LabConfig, st: LabState, build_s: float | None, started: tuple[str, ...], up_s: float | None
) -> LabReport:
    hosts = tuple(
        HostStatus(
            name=r.name,
            address=r.address,
            state="running" if machine.is_running(r) else "stopped",
            ssh=machine.port_open(r.address, 22),
            pid=r.pid,
        )
        for r in sorted(st.hosts.values(), key=lambda r: r.index)
    )
    return LabReport(
        subnet=st.subnet,
        hosts=hosts,
        inventory=st.inventory,
        known_hosts=str(cfg.known_hosts),
        key_file=str(cfg.key_file),
        rootfs=st.rootfs,
        rootfs_build_s=build_s,
        started=started,
        up_s=up_s,
    )
