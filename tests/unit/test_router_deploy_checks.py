"""The router's deploy runs the services' walk (`deploy/skeleton.py`), so it gets the same checks: a release whose
gates never finished is gated by the next deploy (kept, or rolled back), free space is checked before staging,
an incomplete release is marked BAD, a current release edited on the host is replaced, an unchanged router gets
its audit line, and a host lost mid-deploy gets a local audit line. Against a FakeHost, as test_router_deploy."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from opsctl.commands import Cmd
from opsctl.deploy import drift
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import ServicePaths
from opsctl.errors import DeployError, UnreachableError
from opsctl.kernel.gate import GateResult
from opsctl.router import deploy as router_deploy
from opsctl.router.deploy import RouterDeploy
from tests.unit.test_router_deploy import ROOT, SECRET, Host, http, inventory

OLD = "20261201T000000Z-0123456789ab"  # a release that passed its gates
UNIT = "opsctl-router-front.service"
FULL_DF = "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/vda1 10000000 9990000 10000 99% /\n"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RK", SECRET)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


class Releases(Host):
    """A host with several releases, each `id: "bad complete pending"` flags as the facts command prints them."""

    def __init__(self, current: str | None, flags: dict[str, str], files: dict[str, tuple[str, int]]) -> None:
        super().__init__(current)
        self.flags = dict(flags)
        self.files = dict(files)

    def answer(self, cmd: Cmd) -> Any:
        shown = cmd.display()
        if "readlink" in shown and f"{ROOT}/current" in shown:
            flags = {**self.flags, **({self.current: self.flags.get(self.current, "0 1 0")} if self.current else {})}
            lines = "".join(f"release {rid} {f}\n" for rid, f in sorted(flags.items()))
            return (0, f"current {ROOT}/releases/{self.current or ''}\nprevious \n{lines}", "")
        if "mv -T" in shown and "current.tmp" in shown:
            self.current = re.search(r"releases/(\S+?) ", shown).group(1)  # type: ignore[union-attr]
            return None
        return super().answer(cmd)


def first_release() -> tuple[str, dict[str, tuple[str, int]]]:
    """A router deployed once: its release id and the files it wrote (its manifest included)."""
    inv = inventory()
    host = Host()
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.DEPLOYED and result.release is not None, result.message
    return result.release, host.files


def audit_lines(tmp_path: Path) -> list[str]:
    return [line for p in sorted((tmp_path / "state").rglob("*.log")) for line in p.read_text().splitlines()]


def marked_bad(host: Host, release_id: str) -> list[str]:
    return [line for line in host.ran if f"{release_id}/BAD" in line]


def edit_unit(host: Releases, release_id: str) -> Releases:
    """The host's hashing reports `release_id`'s unit file changed since its deploy (edited by hand)."""
    edited = "0" * 64

    def answer(cmd: Cmd) -> Any:
        if "hashlib" in cmd.display():
            return (0, f"{release_id}/unit\t{edited}\n", "")
        return host.answer(cmd)

    host.handler = answer
    return host


def test_a_deploy_marks_the_router_release_pending_until_its_gates_pass() -> None:
    inv = inventory()
    host = Host()
    rid = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy().release  # type: ignore[arg-type]
    mark = host.ran.index(f"touch -- {ROOT}/releases/{rid}/GATES_PENDING")
    restart = host.ran.index(f"systemctl restart -- {UNIT}")
    clear = host.ran.index(f"rm -f -- {ROOT}/releases/{rid}/GATES_PENDING")
    assert mark < restart < clear


def test_a_router_killed_mid_gate_is_gated_by_the_next_deploy_and_kept() -> None:
    """Before: its gates never finished, and the next deploy called it "unchanged"."""
    rid, files = first_release()
    inv = inventory()
    host = Releases(rid, {OLD: "0 1 0", rid: "0 1 1"}, files)
    said: list[str] = []
    result = RouterDeploy(inv, inv.router("front"), host, http(True), said.append).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.DEPLOYED and result.release == rid, result.message
    assert result.message.startswith(f"{rid}: gates finished (interrupted before), healthy after ")
    assert f"rm -f -- {ROOT}/releases/{rid}/GATES_PENDING" in host.ran
    assert not any("systemctl restart" in line for line in host.ran)  # what runs is gated as it runs
    assert said == [f"release {rid} went live but never finished its gates: running them now"]


def test_a_router_killed_mid_gate_that_fails_its_gates_now_is_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    rid, files = first_release()
    answers = iter([False, True])  # the untested release fails; the one restored passes

    def gate(*_: Any, **__: Any) -> GateResult:
        ok = next(answers)
        return GateResult(ok, "healthy" if ok else "crash-looping", 0.1 if ok else None, None, None)

    monkeypatch.setattr(router_deploy, "health_gate", gate)
    inv = inventory()
    host = Releases(rid, {OLD: "0 1 0", rid: "0 1 1"}, files)
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert result.message == (
        f"release {rid} never finished its gates, and fails them now: crash-looping; rolled back to {OLD} "
        f"(healthy); {rid} marked bad"
    )
    assert marked_bad(host, rid) and host.current == OLD


def test_plan_of_a_router_with_unfinished_gates_says_what_the_deploy_does() -> None:
    rid, files = first_release()
    inv = inventory()
    host = Releases(rid, {rid: "0 1 1"}, files)
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy(plan=True)  # type: ignore[arg-type]
    assert result.outcome is Outcome.PLANNED
    assert result.message == (
        f"release {rid} never finished its gates: run them (health, /readiness) and keep it, or roll back to "
        "(nothing: stop the router)"
    )


def test_a_router_is_not_staged_into_a_full_disk(tmp_path: Path) -> None:
    inv = inventory(policy="random")
    host = Releases(OLD, {}, {})
    host.handler = lambda cmd: (0, FULL_DF, "") if "df -P -B1" in cmd.display() else host.answer(cmd)
    with pytest.raises(DeployError) as err:
        RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert err.value.message == (
        f"h1: only 9.8 KiB free in / ({ROOT}/releases), a release needs 256.0 MiB; nothing was changed"
    )
    assert not any("pip install" in line or "mkdir -p -- " in line for line in host.ran)
    refused = [line for line in audit_lines(tmp_path) if "result=refused" in line]
    assert len(refused) == 1 and "service=router-front" in refused[0] and "a release needs 256.0 MiB" in refused[0]


def test_an_incomplete_router_release_is_marked_bad_before_staging() -> None:
    incomplete = "20261201T010000Z-aaaaaaaaaaaa"
    inv = inventory(policy="random")
    host = Releases(OLD, {incomplete: "0 0 0"}, {})
    said: list[str] = []
    result = RouterDeploy(inv, inv.router("front"), host, http(True), said.append).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.DEPLOYED, result.message
    marks = marked_bad(host, incomplete)
    assert len(marks) == 1 and "incomplete: staging never finished" in marks[0]
    assert marks[0] in host.ran[: host.ran.index(f"systemctl restart -- {UNIT}")]
    assert f"marked incomplete release {incomplete} BAD (its staging never finished)" in said


def test_a_current_router_release_edited_on_the_host_is_replaced() -> None:
    """Its unit edited by hand: the hash of the inventory is current's, but what runs is not what was deployed."""
    rid, files = first_release()
    inv = inventory()
    host = edit_unit(Releases(rid, {}, files), rid)
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.DEPLOYED and result.release != rid, result.message
    assert result.message.endswith(f"; drifted {rid} marked bad")
    assert marked_bad(host, rid) and host.current == result.release


def test_the_drift_check_masks_the_router_key_on_the_host_as_the_manifest_does(tmp_path: Path) -> None:
    """router.json holds the key; its recorded digest is of the masked file. The host's hashing masks it the same
    way, so an unchanged router with a key is not "drifted" forever (the host's script run here on the file)."""
    rid, files = first_release()
    config, _ = files[f"{ROOT}/releases/{rid}/router.json"]
    assert SECRET in config
    recorded = json.loads(files[f"{ROOT}/releases/{rid}/manifest.json"][0])["files"]["router.json"]
    argv = list(drift.hash_cmd(ServicePaths("router-front"), {}).argv)
    script = argv[argv.index("python3") : argv.index("python3") + 3]  # python3 -c CODE, without the host's pairs
    written = tmp_path / "router.json"
    written.write_text(config)
    out = subprocess.run([*script, f"r/router.json={written}"], capture_output=True, text=True, check=True).stdout
    assert out == f"r/router.json\t{recorded}\n" and SECRET not in out


def test_an_unchanged_router_gets_its_audit_line(tmp_path: Path) -> None:
    rid, files = first_release()
    inv = inventory()
    host = Releases(rid, {}, files)
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNCHANGED, result.message
    mine = [line for line in audit_lines(tmp_path) if f"release={rid}" in line and "result=unchanged" in line]
    assert len(mine) == 1 and "action=deploy" in mine[0] and "service=router-front" in mine[0]
    assert any("audit.log" in line and "result=unchanged" in line for line in host.ran)  # the host's copy


class GoneAtRestart(Releases):
    def answer(self, cmd: Cmd) -> Any:
        if cmd.display().startswith("systemctl restart"):
            return UnreachableError("h1", "connection lost")
        return super().answer(cmd)


def test_a_router_host_lost_mid_deploy_is_unreachable_with_a_local_audit_line(tmp_path: Path) -> None:
    inv = inventory(policy="random")
    host = GoneAtRestart(OLD, {}, {})
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNREACHABLE
    assert result.message.startswith("host became unreachable mid-deploy: connection lost")
    lines = [line for line in audit_lines(tmp_path) if f"release={result.release}" in line]
    assert [re.search(r"result=(\S+)", line).group(1) for line in lines] == ["started", "unreachable"]  # type: ignore[union-attr]
    assert not any("reset-failed" in line for line in host.ran)  # no rollback tried against a host that is gone


def test_a_router_rollback_to_a_target_edited_on_the_host_says_so() -> None:
    """As a service's rollback: the target goes live (health gated), and the message and progress say which of its
    files changed on the host since its deploy."""
    rid, files = first_release()
    old_files = {k.replace(rid, OLD): v for k, v in files.items()}
    inv = inventory()
    host = edit_unit(Releases(rid, {OLD: "0 1 0"}, {**files, **old_files}), OLD)
    said: list[str] = []
    result = RouterDeploy(inv, inv.router("front"), host, http(True), said.append).rollback()  # type: ignore[arg-type]
    assert result.outcome is Outcome.REVERTED and host.current == OLD, result.message
    assert result.message.startswith(f"rolled back to {OLD} (healthy); its files changed on the host since its deploy")
    assert any(line.startswith("rollback target drifted: ") and "unit" in line for line in said), said
