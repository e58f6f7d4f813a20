"""The lab tier's three parts (tests/lab/lab_parts.py) never share a lab: names, subnets, dirs, inventory."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tests.lab import lab_parts

# Subnets the lab tests use besides the session's lab: test_lab's second labs and test_pip_index's namespace.
OTHER_NETS = {"10.214.0.0/24", "10.215.0.0/24", "10.218.0.0/24", *(f"10.{240 + n}.0.0/24" for n in range(10))}


def _config(monkeypatch: pytest.MonkeyPatch, slot: str, part: str) -> lab_parts.LabConfig:
    monkeypatch.setenv("OPSCTL_LAB_SLOT", slot)
    monkeypatch.setenv("OPSCTL_LAB_PART", part)
    return lab_parts.lab_config()


def _names(cfg: lab_parts.LabConfig) -> set[str]:
    return {
        str(cfg.subnet),
        str(cfg.inventory_path),
        str(cfg.root_dir),
        str(cfg.state_dir),
        cfg.bridge,
        cfg.netns("lab1"),
    }


def test_the_parts_of_every_slot_share_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = {(s, p): _config(monkeypatch, s, p) for s in ["", *map(str, range(1, 10))] for p in lab_parts.PARTS}
    seen: dict[str, tuple[str, str]] = {}
    for key, cfg in configs.items():
        assert len(cfg.netns("lab9")) <= 15 and len(cfg.bridge) <= 15  # Linux interface names
        assert str(cfg.subnet) not in OTHER_NETS
        for name in _names(cfg):
            assert name not in seen, f"{key} and {seen[name]} share {name}"
            seen[name] = key
    assert {p for _, p in configs} == {"1", "2", "3"}
    nets = [ipaddress.IPv4Network(str(c.subnet)) for c in configs.values()]
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :])


def test_part_1_is_the_whole_tiers_lab_with_its_own_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    whole, one = _config(monkeypatch, "", ""), _config(monkeypatch, "", "1")
    assert whole.inventory_path.name == "lab.yaml" and one.inventory_path.name == "lab-p1.yaml"
    assert (whole.subnet, whole.prefix, whole.state_dir) == (one.subnet, one.prefix, one.state_dir)
    assert whole.prefix == lab_parts.LabConfig().prefix  # `opsctl lab status` (test_lab) looks at this one


def test_each_module_is_in_exactly_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    modules = sorted(p.name for p in (lab_parts.REPO / "tests" / "lab").glob("test_*.py"))
    picked = {}
    for part in lab_parts.PARTS:
        monkeypatch.setenv("OPSCTL_LAB_PART", part)
        picked[part] = {m for m in modules if lab_parts.in_part(m)}
    assert all(picked.values())  # a part with no module left (a renamed one) would still bring up a lab
    assert set().union(*picked.values()) == set(modules)
    assert sum(map(len, picked.values())) == len(modules)  # no module in two parts
    # the router's deploys and the journey's and bench's are the tier's longest: never in one part
    longest = {lab_parts.part_of(m) for m in ("test_journey.py", "test_lab_bench.py")}
    assert lab_parts.part_of("test_router.py") not in longest
    monkeypatch.setenv("OPSCTL_LAB_PART", "")
    assert all(lab_parts.in_part(m) for m in modules)


def test_a_bad_part_or_slot_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_LAB_PART", "4")
    with pytest.raises(lab_parts.LabEnvError, match=r"^OPSCTL_LAB_PART must be one of 1, 2, 3, got '4'$"):
        lab_parts.part()
    monkeypatch.setenv("OPSCTL_LAB_SLOT", "10")
    with pytest.raises(lab_parts.LabEnvError, match=r"^OPSCTL_LAB_SLOT must be one digit 1-9, got '10'$"):
        lab_parts.slot()


def test_the_cli_and_the_lab_tests_see_one_lab_per_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """`OPSCTL_LAB_SLOT=N opsctl lab ...` (scripts/lab-journey) works on the lab the tier's tests use in slot N."""
    from opsctl.cli.lab import _config

    monkeypatch.setenv("OPSCTL_LAB_PART", "")
    for slot in ["", *map(str, range(1, 10))]:
        monkeypatch.setenv("OPSCTL_LAB_SLOT", slot)
        cli, tests = _config(), lab_parts.lab_config()
        assert (cli.subnet, cli.prefix, cli.root_dir, cli.state_dir) == (
            tests.subnet, tests.prefix, tests.root_dir, tests.state_dir,
        )  # fmt: skip
        assert str(cli.inventory_path) == (f"inventory/lab-{slot}.yaml" if slot else "inventory/lab.yaml")
    monkeypatch.setenv("OPSCTL_LAB_SLOT", "2")
    assert (str(_config().subnet), _config().prefix, _config().state_dir.name) == (
        "10.222.0.0/24",
        "olab2",
        "opsctl-lab-2",
    )
    assert str(_config("10.199.0.0/24").subnet) == "10.199.0.0/24"  # --subnet still wins


def test_the_cli_refuses_a_bad_slot_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsctl.cli.lab import _config
    from opsctl.errors import LabError

    monkeypatch.setenv("OPSCTL_LAB_SLOT", "x; rm -rf /")
    with pytest.raises(LabError) as info:
        _config()
    assert info.value.one_line().startswith("OPSCTL_LAB_SLOT: a lab slot is one digit 1-9, got 'x; rm -rf /'")
    assert "\n" not in info.value.one_line()


def test_lab_prepare_fills_the_wheelhouse_that_provision_of_the_lab_reuses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`opsctl lab prepare` (scripts/setup) downloads for the lock and into the directory that `provision -i
    inventory/lab.yaml` asks for, so provision finds it stamped and downloads nothing."""
    import yaml

    from opsctl.cli import lab as cli_lab
    from opsctl.inventory.load import parse_inventory
    from opsctl.kernel.locks import lock_for
    from opsctl.lab import inventory
    from opsctl.lab.config import LabConfig
    from opsctl.lab.state import HostRecord

    asked: list[tuple[str, str, Path]] = []
    monkeypatch.setattr(cli_lab.wheelhouse, "ensure", lambda lock, path: asked.append((lock.name, lock.sha256, path)))
    cfg = LabConfig(inventory_path=tmp_path / "lab.yaml", root_dir=tmp_path / "lab")
    cli_lab._lab_wheelhouse(cfg)
    records = [HostRecord(f"lab{i}", i, str(cfg.address(i)), f"olab-lab{i}", f"olab-lab{i}", "") for i in (1, 2)]
    written = parse_inventory(yaml.safe_load(inventory.write(cfg, records).read_text()), "lab.yaml")
    wanted = {(lock_for(h).name, lock_for(h).sha256, Path(str(h.wheelhouse))) for h in written.hosts}
    assert asked and set(asked) == wanted == {(asked[0][0], asked[0][1], Path(inventory.WHEELHOUSE))}
    assert asked[0][0] == "reference-cpu.txt"
