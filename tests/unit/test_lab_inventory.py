"""The lab's generated inventory goes through the real loader; the lab state round-trips."""

from __future__ import annotations

from pathlib import Path

import yaml

from opsctl.inventory.load import parse_inventory
from opsctl.inventory.model import Engine, HostKeyPolicy, Mode, ModelSourceKind
from opsctl.lab import inventory, state
from opsctl.lab.config import LabConfig
from opsctl.lab.state import HostRecord, LabState


def _record(index: int) -> HostRecord:
    name = f"lab{index}"
    return HostRecord(name, index, f"10.213.0.{10 + index}", f"olab-{name}", f"olab-{name}", f"/x/{name}")


def test_lab_inventory_is_valid_for_the_loader(tmp_path: Path) -> None:
    cfg = LabConfig(inventory_path=tmp_path / "lab.yaml", root_dir=tmp_path / "lab")
    path = inventory.write(cfg, [_record(2), _record(1)])
    text = path.read_text()
    assert text.startswith(inventory.HEADER)
    inv = parse_inventory(yaml.safe_load(text), str(path), base_dir=tmp_path)
    assert [(h.name, h.address, h.gpu_count, h.cuda) for h in inv.hosts] == [
        ("lab1", "10.213.0.11", 0, None),
        ("lab2", "10.213.0.12", 0, None),
    ]
    ssh = inv.host("lab1").ssh
    assert (ssh.user, ssh.port, ssh.host_key_policy) == ("root", 22, HostKeyPolicy.STRICT)
    assert ssh.key_file == str(tmp_path / "lab/ssh/id_ed25519")
    assert ssh.known_hosts_file == str(tmp_path / "lab/ssh/known_hosts")
    (svc,) = inv.host("lab1").services
    assert (svc.engine, svc.device, svc.mode, svc.port) == (Engine.REFERENCE, "cpu", Mode.SHADOW, 30000)
    assert svc.model.source_on is ModelSourceKind.CONTROL and svc.model.path.startswith("/dev/shm/")
    assert inv.warnings == ()


def test_remove_only_touches_files_we_wrote(tmp_path: Path) -> None:
    ours = inventory.write(LabConfig(inventory_path=tmp_path / "lab.yaml"), [_record(1)])
    theirs = tmp_path / "mine.yaml"
    theirs.write_text("hosts: {}\n")
    inventory.remove(str(ours))
    inventory.remove(str(theirs))
    assert not ours.exists() and theirs.exists()


def test_state_round_trip(tmp_path: Path) -> None:
    cfg = LabConfig(state_dir=tmp_path / "state")
    assert state.load(cfg) is None
    st = LabState(subnet="10.213.0.0/24", bridge="olab0", rootfs="/r").with_host(_record(1))
    st = st.with_host(_record(2)).without_host("lab1")
    with state.locked(cfg):
        state.save(cfg, st)
    assert state.load(cfg) == st
    state.remove(cfg)
    assert state.load(cfg) is None
