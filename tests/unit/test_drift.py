"""Drift: a hand-edited unit or release file was invisible (`status` exited 0, `deploy` said
unchanged). The host hashes a release's files (its API key masked there, as rendered), the comparison with the
manifest's digests is pure; `status` reports each difference in one line and fails."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from opsctl import status
from opsctl.commands import Cmd
from opsctl.deploy import drift, flow, release
from opsctl.deploy.outcome import Outcome
from opsctl.inventory.load import load_inventory
from opsctl.remote.fake import FakeHost
from tests.unit.test_rollout_flow import SETTINGS, Box, ctx_for  # noqa: F401

GOLDEN = Path(__file__).parent / "golden"
RID, OLD = "20260101T000000Z-abc123abc123", "20251231T000000Z-def456def456"


def _masked() -> dict[str, str]:
    return {name: (GOLDEN / "ref-shadow" / name).read_text() for name in ("unit", "env", "server.yaml")}


def _host_side(tmp_path: Path, files: dict[str, str], installed: str | None) -> dict[str, str | None]:
    """The command's own script, run by this machine's python over a release dir in tmp_path."""
    cmd = drift.hash_cmd(release.ServicePaths("ref-shadow"), {RID: sorted(files)})
    code = str(cmd.argv[cmd.argv.index("-c") + 1])
    pairs = [f"{RID}/{name}={tmp_path / name}" for name in sorted(files)]
    pairs.append(f"{drift.INSTALLED}={installed or tmp_path / 'absent'}")
    out = subprocess.run([sys.executable, "-c", code, *pairs], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return drift.parse_hashes(out.stdout)


def test_an_untouched_release_with_its_key_has_no_drift_and_each_edit_is_one_line(tmp_path: Path) -> None:
    masked = _masked()
    recorded = release.file_digests(masked)
    for name, text in masked.items():  # as written to the host: the key revealed
        (tmp_path / name).write_text(text.replace('api-key: "***"', 'api-key: "hunter2-drift-key"'))
    installed = tmp_path / "opsctl-ref-shadow.service"
    installed.write_text(masked["unit"])
    assert drift.differences(RID, recorded, _host_side(tmp_path, masked, str(installed)), str(installed)) == []
    (tmp_path / "env").write_text(masked["env"] + "DDTREE_BUDGET=64\n")  # edited by hand
    installed.write_text(masked["unit"].replace("Restart=", "#Restart="))
    (tmp_path / "server.yaml").unlink()
    lines = drift.differences(RID, recorded, _host_side(tmp_path, masked, str(installed)), str(installed))
    assert lines[0].startswith(f"release {RID}: env changed on the host since the deploy (sha256 ")
    assert lines[1] == f"release {RID}: server.yaml is missing on the host"
    assert lines[2] == f"{installed} differs from release {RID}'s unit (edited on the host)"
    assert len(lines) == 3 and all("hunter2" not in line for line in lines)


def test_parse_hashes_keeps_only_what_it_reads() -> None:
    digest = "a" * 64
    assert drift.parse_hashes(f"r/unit\t{digest}\nr/env\t-\ngarbage\nr/x\tnot-a-digest\n") == {
        "r/unit": digest,
        "r/env": None,
    }
    assert drift.differences("r", {"unit": digest, "env": "b" * 64}, {}) == []  # unread: no claim


@pytest.fixture
def row(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    inv = load_inventory(GOLDEN / "inventory.yaml")
    host = inv.hosts[0]
    svc = host.service("ref-shadow")
    paths = release.ServicePaths(svc.name)
    masked = _masked()
    manifests = {
        rid: release.Manifest(rid, svc.name, host.name, "shadow", "reference", rid[-12:], "2026", "w.whl", "s" * 64,
                              "0.1", "0.1", (), release.file_digests(masked)).to_json()
        for rid in (RID, OLD)
    }  # fmt: skip
    edited = release.file_digests({"unit": masked["unit"] + "# edited\n"})["unit"]

    def handler(cmd: Cmd) -> tuple[int, str, str] | None:
        shown = cmd.display()
        if shown.startswith("systemctl show"):
            return (0, "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n", "")
        if cmd.argv[:2] == ("python3", "-c") and drift.INSTALLED in shown:
            ok = release.file_digests(masked)
            lines = [f"{rid}/{n}\t{ok[n] if (rid, n) != (OLD, 'env') else 'c' * 64}" for rid in (RID, OLD) for n in ok]
            lines.append(f"{drift.INSTALLED}\t{edited}")
            return (0, "\n".join(lines) + "\n", "")
        return None

    fake = FakeHost(host.name, handler=handler)
    fake.files.update({f"{paths.release(r)}/{release.MANIFEST}": (t, 0o644) for r, t in manifests.items()})
    monkeypatch.setattr(
        release,
        "parse_release_facts",
        lambda _out: release.ReleaseFacts(
            RID, (release.ReleaseEntry(OLD, False, True), release.ReleaseEntry(RID, False, True)), OLD
        ),
    )
    http = httpx.Client(transport=httpx.MockTransport(lambda _r: httpx.Response(200)))
    return status.collect(fake, host, svc, http)


def test_status_reports_a_hand_edited_unit_and_fails(row: status.ServiceStatus) -> None:
    assert row.healthy and row.failing
    assert (
        row.drift[0]
        == f"/etc/systemd/system/opsctl-ref-shadow.service differs from release {RID}'s unit (edited on the host)"
    )
    assert row.drift[1].startswith(f"rollback target release {OLD}: env changed on the host since the deploy")
    assert len(row.drift) == 2


def test_deploy_repairs_drift_without_force_and_rollback_says_a_target_drifted(ctx_for) -> None:  # noqa: F811
    """`deploy` once said "unchanged" over a hand-edited release; only --force repaired it."""
    make, wheel, said = ctx_for
    ctx, first_host = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)
    ctx, fake = make(box)
    fake.files.update(first_host.files)  # the release's files and manifest, as the first deploy wrote them
    assert flow.deploy_service(ctx, wheel, SETTINGS).outcome is Outcome.UNCHANGED  # the host answers no drift

    def edited(cmd: Cmd):  # type: ignore[no-untyped-def]
        if cmd.argv[:2] == ("python3", "-c") and drift.INSTALLED in cmd.display():
            return (0, f"{first.release}/env\t{'e' * 64}\n", "")  # the env file edited by hand
        return box.handler(cmd)

    fake.handler = edited
    again = flow.deploy_service(ctx, wheel, SETTINGS)
    assert again.outcome is Outcome.DEPLOYED and again.release != first.release, again.message
    assert again.release[-12:] == first.release[-12:]  # the same configuration, written again
    assert any(line.startswith(f"drift: release {first.release}: env changed on the host") for line in said)
    # the edited release is no rollback target once replaced (status named it one and failed: seen in the lab)
    assert f"drifted {first.release} marked bad" in again.message
    box.current = again.release
    box.releases[again.release] = 0
    assert box.bad == {first.release}
    # rolling back to it by name: it is BAD now, so only with --force; done, and said
    from opsctl.errors import DeployError

    with pytest.raises(DeployError, match=f"release {first.release} is marked BAD"):
        flow.rollback_service(ctx, replace(SETTINGS, allow_old_secrets=True), to=first.release)
    back = flow.rollback_service(ctx, replace(SETTINGS, allow_old_secrets=True, force=True), to=first.release)
    assert back.outcome is Outcome.REVERTED and "its files changed on the host since its deploy" in back.message
    assert any(line.startswith("rollback target drifted: release ") for line in said)


def test_a_drifted_rollback_target_is_retired_by_the_deploy_status_names(ctx_for) -> None:  # noqa: F811
    """Before, when only the rollback target's files had changed, `status` stayed red and the deploy it printed was
    a no-op ("unchanged"). Now that deploy marks the target BAD (its files cannot be written again: they were
    rendered from the inventory of their day) and says so; status then has nothing drifted to name."""
    from opsctl.cli.common import console
    from opsctl.cli.status import _table

    make, wheel, said = ctx_for
    ctx, first_host = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)
    ctx, fake = make(box)
    fake.files.update(first_host.files)
    second = flow.deploy_service(ctx, wheel, replace(SETTINGS, force=True))  # same config, a new release
    assert second.outcome is Outcome.DEPLOYED and second.release != first.release, second.message
    box.current = second.release
    box.releases[second.release] = 0

    def target_edited(cmd: Cmd):  # type: ignore[no-untyped-def]
        if cmd.argv[:2] == ("python3", "-c") and drift.INSTALLED in cmd.display():
            return (0, f"{first.release}/env\t{'e' * 64}\n", "")  # the target's env edited by hand
        return box.handler(cmd)

    fake.handler = target_edited
    row = replace(
        status.collect(fake, ctx.host, ctx.service, ctx.http), healthy=True
    )  # the suggestion status prints for it
    assert row.drift and all(line.startswith("rollback target ") for line in row.drift) and row.failing
    with console.capture() as out:
        _table([row])
    suggestion = " ".join(out.get().split())
    assert (
        f"`opsctl deploy -i INVENTORY --host {ctx.host.name} --service {ctx.service.name}` marks the drifted rollback "
        f"target {first.release} BAD" in suggestion
    )
    said.clear()
    repaired = flow.deploy_service(ctx, wheel, SETTINGS)  # the command status printed
    assert repaired.outcome is Outcome.UNCHANGED and repaired.release == second.release, repaired.message
    assert repaired.message.endswith(f"; drifted rollback target {first.release} marked bad")
    assert box.bad == {first.release}
    assert any(
        line.startswith(f"rollback target {first.release} drifted (release {first.release}: env") for line in said
    )
    after = status.collect(fake, ctx.host, ctx.service, ctx.http)
    assert after.rollback_to is None and after.drift == []
    assert (
        flow.deploy_service(ctx, wheel, SETTINGS).message == f"release {second.release}: same config, nothing restarted"
    )
