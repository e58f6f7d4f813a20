"""The audit log: refusals are audited (free space, old secrets, missing secrets, ...), and the
control machine keeps one log per inventory file, each line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.commands import Cmd
from opsctl.deploy.flow import DeploySettings
from opsctl.errors import DeployError, RemoteError
from opsctl.inventory.load import load_inventory
from opsctl.kernel import audit
from opsctl.remote.fake import FakeHost
from opsctl.rollout import runner
from opsctl.rollout.runner import RolloutOptions
from opsctl.wheel import RuntimeWheel

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
OLD = "20261129T200000Z-aaaaaaaaaaaa"
NEW = "20261129T210000Z-bbbbbbbbbbbb"
FULL_DF = "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/vda1 10000000 9990000 10000 99% /\n"


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k3y-never-logged")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def _host_handler(current: str, releases: list[str]):
    def handler(cmd: Cmd):
        text = cmd.display()
        if "readlink" in text:
            lines = [f"current /opt/opsctl/services/ref-shadow/releases/{current}"]
            return (0, "\n".join([*lines, *(f"release {r} 0 1" for r in releases)]) + "\n", "")
        if "df -P -B1" in text:
            return (0, FULL_DF, "")
        if "lock" in text and "mkdir" in text:
            return (0, "acquired\n", "")
        return None

    return handler


def _deploy(inventory: Path, handler, action: str = "deploy", tmp: Path | None = None) -> list[FakeHost]:
    inv = load_inventory(inventory)
    host = inv.hosts[0]
    fakes: list[FakeHost] = []

    def connect(h):
        fakes.append(FakeHost(h.name, handler=handler))
        return fakes[-1]

    selection = [(host, [host.service("ref-shadow")])]
    settings = DeploySettings(force=True)
    if action == "deploy":
        wheel = RuntimeWheel((tmp or Path("/nonexistent")) / "w.whl", "f" * 64)
        report = runner.deploy(selection, wheel, settings, RolloutOptions(), say=lambda _m: None, connect=connect)
    else:
        report = runner.rollback(selection, settings, RolloutOptions(), say=lambda _m: None, connect=connect)
    assert report.failures == 1
    return fakes


def _local_lines(inventory: Path) -> list[str]:
    path = audit.local_log_path(str(inventory.resolve()))
    return path.read_text().splitlines() if path.exists() else []


def test_free_space_refusal_is_audited_locally_and_on_the_host(state: Path, tmp_path: Path) -> None:
    fakes = _deploy(GOLDEN, _host_handler(OLD, [OLD]), tmp=tmp_path)
    lines = [ln for ln in _local_lines(GOLDEN) if "result=refused" in ln]
    assert len(lines) == 1 and "action=deploy" in lines[0] and "service=ref-shadow" in lines[0]
    assert "free" in lines[0] and f"inventory={GOLDEN.resolve()}" in lines[0]
    assert any("audit.log" in c and "result=refused" in c for c in fakes[0].ran)
    assert not any("k3y-never-logged" in ln for ln in lines)


def test_rollback_refusal_is_audited(state: Path) -> None:
    _deploy(GOLDEN, _host_handler(NEW, [OLD, NEW]), action="rollback")  # OLD has no secrets fingerprint
    lines = [ln for ln in _local_lines(GOLDEN) if "result=refused" in ln]
    assert len(lines) == 1 and "action=rollback" in lines[0] and "API key" in lines[0]


def test_missing_secret_refusal_is_audited_without_touching_a_host(
    state: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OPSCTL_GOLDEN_KEY")
    with pytest.raises(DeployError):
        _deploy(GOLDEN, _host_handler(OLD, [OLD]), tmp=tmp_path)
    lines = _local_lines(GOLDEN)
    assert len(lines) == 1 and "result=refused" in lines[0] and "OPSCTL_GOLDEN_KEY" in lines[0]


def test_each_inventory_has_its_own_local_log(state: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "inventory.yaml"  # same file name, another directory
    other.parent.mkdir()
    other.write_text(GOLDEN.read_text())
    _deploy(GOLDEN, _host_handler(OLD, [OLD]), tmp=tmp_path)
    _deploy(other, _host_handler(OLD, [OLD]), tmp=tmp_path)
    mine, theirs = _local_lines(GOLDEN), _local_lines(other)
    assert audit.local_log_path(str(GOLDEN.resolve())) != audit.local_log_path(str(other.resolve()))
    assert len(mine) == 1 and len(theirs) == 1
    assert f"inventory={other.resolve()}" in theirs[0] and str(other.resolve()) not in mine[0]


def test_plan_writes_no_audit_line(state: Path, tmp_path: Path) -> None:
    inv = load_inventory(GOLDEN)
    host = inv.hosts[0]
    report = runner.rollback(
        [(host, [host.service("ref-shadow")])], DeploySettings(plan=True), RolloutOptions(), say=lambda _m: None,
        connect=lambda h: FakeHost(h.name, handler=_host_handler(NEW, [OLD, NEW])),
    )  # fmt: skip
    assert report.failures == 1 and _local_lines(GOLDEN) == []


class _Gone:
    def run(self, cmd: Cmd, timeout: float | None = None, check: bool = True) -> None:
        raise RemoteError("lab1", "printf", None, "connection lost")


def test_record_writes_the_inventorys_log_then_the_hosts_and_survives_a_host_that_is_gone(state: Path) -> None:
    host = load_inventory(GOLDEN).hosts[0]
    fake = FakeHost(host.name)
    line = audit.record(host, "ref-shadow", "deploy", NEW, "ok", "previous=-", conn=fake)
    assert line.endswith(f"inventory={GOLDEN.resolve()}") and f"release={NEW} result=ok" in line
    assert _local_lines(GOLDEN) == [line]
    assert len(fake.ran) == 1 and audit.HOST_LOG in fake.ran[0] and "action=deploy" in fake.ran[0]
    gone = audit.record(host, "ref-shadow", "deploy", NEW, "unreachable", conn=_Gone())  # type: ignore[arg-type]
    assert _local_lines(GOLDEN) == [line, gone]
    local_only = audit.record(host, "ref-shadow", "deploy", NEW, "failed")
    assert _local_lines(GOLDEN)[-1] == local_only and len(fake.ran) == 1
