"""`opsctl lab prepare|up|status|down`: disposable local test hosts (systemd-nspawn + SSH). Needs root."""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from opsctl import wheelhouse
from opsctl.cli.common import JsonOpt, console, emit_json, handle_errors
from opsctl.errors import LabError
from opsctl.inventory.load import parse_inventory
from opsctl.kernel.locks import lock_for
from opsctl.lab import LabConfig, LabReport, down, prepare, rootfs, status, up
from opsctl.lab import inventory as lab_inventory
from opsctl.lab.config import SLOT_ENV, env_slot, host_name, slot_config
from opsctl.lab.state import HostRecord

SubnetOpt = Annotated[
    str | None,
    typer.Option(
        "--subnet",
        help="Private IPv4 range the lab owns (refused if it overlaps a route). "
        "Default: 10.213.0.0/24, or 10.22N.0.0/24 with OPSCTL_LAB_SLOT=N.",
    ),
]
LabInventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        help="Where `up` writes the lab inventory. Default: inventory/lab.yaml, or inventory/lab-N.yaml with "
        "OPSCTL_LAB_SLOT=N.",
    ),
]


def _config(subnet: str | None = None, inventory: Path | None = None) -> LabConfig:
    """The default lab, or slot N's (OPSCTL_LAB_SLOT=N: a lab of its own beside the default one)."""
    slot = env_slot()
    try:
        base = slot_config(slot)
    except ValueError as exc:
        raise LabError(f"{SLOT_ENV}: {exc}", f"set {SLOT_ENV} to 1-9, or unset it for the default lab") from None
    if inventory is None:
        inventory = Path(f"inventory/lab-{slot}.yaml") if slot else base.inventory_path
    base = replace(base, inventory_path=inventory)
    if subnet is None:
        return base
    try:
        network = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise LabError(f"--subnet {subnet!r} is not an IPv4 network: {exc}", "e.g. --subnet 10.213.0.0/24") from None
    if not network.is_private or network.prefixlen > 28:
        raise LabError(f"--subnet {subnet} must be a private range of at least /28")
    return replace(base, subnet=network)


def _lab_wheelhouse(cfg: LabConfig) -> wheelhouse.Wheelhouse:
    """The wheelhouse that `provision` of the lab inventory uses: the lock and directory of its first host, read
    from the inventory `lab up` writes (so `provision` finds this very one, stamped for its lock)."""
    first = HostRecord(host_name(1), 1, str(cfg.address(1)), cfg.netns("lab1"), cfg.netns("lab1"), "")
    host = parse_inventory(lab_inventory.document(cfg, [first]), "lab inventory").hosts[0]
    if host.wheelhouse is None:
        raise LabError("the lab inventory names no wheelhouse")
    return wheelhouse.ensure(lock_for(host), Path(host.wheelhouse))


def _seconds(built_s: float | None) -> str:
    return "cached" if built_s is None else f"built in {built_s:.0f}s"


def _print(report: LabReport) -> None:
    if not report.hosts:
        console.print("no lab is running")
        return
    for host in report.hosts:
        ssh = "ssh ok" if host.ssh else "ssh down"
        console.print(f"{host.name:8} {host.address:15} {host.state:8} {ssh}")
    if report.inventory:
        console.print(f"inventory: {report.inventory}")


def register(app: typer.Typer) -> None:
    lab = typer.Typer(
        name="lab",
        help="Disposable local test hosts: real systemd + sshd in network namespaces (needs root).",
        no_args_is_help=True,
    )

    @lab.command("up")
    @handle_errors
    def _up(
        hosts: Annotated[int, typer.Option("--hosts", min=1, max=32, help="Number of hosts.")] = 2,
        subnet: SubnetOpt = None,
        inventory: LabInventoryOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Boot lab1..labN (idempotent); write the lab inventory."""
        cfg = _config(subnet, inventory)
        if not rootfs.cache_path(cfg).is_dir():
            console.print(f"building the lab rootfs once into {cfg.cache_dir} (mmdebstrap, about 1 minute)...")
        report = up(cfg, hosts)
        if report.rootfs_build_s is not None:
            console.print(f"built the rootfs in {report.rootfs_build_s:.0f}s ({report.rootfs})")
        started = ", ".join(report.started) or "none (all running)"
        console.print(f"started: {started} in {report.up_s or 0:.1f}s")
        if json_out:
            emit_json(report)
        else:
            _print(report)

    @lab.command("prepare")
    @handle_errors
    def _prepare(
        rootfs_part: Annotated[bool, typer.Option("--rootfs/--no-rootfs", help="The hosts' Debian rootfs.")] = True,
        models_part: Annotated[
            bool, typer.Option("--models/--no-models", help="The tiny target and drafter (needs ddtree-runtime).")
        ] = True,
        wheels_part: Annotated[
            bool, typer.Option("--wheelhouse/--no-wheelhouse", help="The wheels `provision` pushes to lab hosts.")
        ] = True,
        json_out: JsonOpt = False,
    ) -> None:
        """Build what `lab up` and a provision of the lab need, without booting a host (all at once; what is
        cached is kept): the rootfs, the tiny models and the wheelhouse. `scripts/setup` runs it."""
        cfg = _config()
        with ThreadPoolExecutor(1, thread_name_prefix="wheelhouse") as pool:
            wheels = pool.submit(_lab_wheelhouse, cfg) if wheels_part else None
            done = prepare(cfg, rootfs_part=rootfs_part, models_part=models_part)
            house = wheels.result() if wheels is not None else None
        lines = []
        if done.rootfs:
            lines.append(f"rootfs: {_seconds(done.rootfs_build_s)} ({done.rootfs})")
        if done.models:
            lines.append(f"tiny models: {_seconds(done.models_build_s)} ({done.models})")
        if house is not None:
            got = "downloaded" if house.built else "cached"
            lines.append(f"wheelhouse: {got}, {len(house.files)} wheels ({house.path})")
        if json_out:
            emit_json({"prepared": done, "wheelhouse": house})
        for line in lines:
            console.print(line)

    @lab.command("status")
    @handle_errors
    def _status(json_out: JsonOpt = False) -> None:
        """List lab hosts and their state."""
        report = status(_config())
        if json_out:
            emit_json(report)
        else:
            _print(report)

    @lab.command("down")
    @handle_errors
    def _down(json_out: JsonOpt = False) -> None:
        """Remove every lab container, namespace, veth, mount and per-host directory (idempotent)."""
        removed = down(_config())
        if json_out:
            emit_json({"removed": removed})
        else:
            console.print(f"removed: {', '.join(removed) or 'nothing (no lab)'}")

    app.add_typer(lab)
