"""The per-service deploy flow against a scripted FakeHost and a fake HTTP transport: the exact order of the
live-changing steps, unchanged detection, pre-flight refusal, rollback on a failed gate, --plan."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from opsctl.commands import Cmd
from opsctl.deploy import flow
from opsctl.deploy.context import ServiceContext
from opsctl.deploy.flow import DeploySettings
from opsctl.deploy.outcome import Outcome
from opsctl.errors import OpsctlError
from opsctl.inventory.load import load_inventory
from opsctl.kernel.gate import GateResult
from opsctl.remote.fake import FakeHost
from opsctl.wheel import RuntimeWheel

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
NOW = datetime(2026, 11, 29, 22, 30, 0, tzinfo=UTC)
HELP = "usage: ddtree-serve [--config FILE] [--model-path P] [--host H] [--port P] [--dtype D] [--device D]\n" + (
    "  --speculative-algorithm A --speculative-draft-model-path P --disable-overlap-schedule --page-size N\n"
    "  --attention-backend B --api-key K --served-model-name N\n"
)
OLD = "20261129T200000Z-aaaaaaaaaaaa"
SETTINGS = DeploySettings(readiness_delay=0.0, health_timeout=5.0, poll_s=0.01)


class Box:
    """A host's systemd + release state, scripted by the test."""

    def __init__(self, current: str | None, crash_after_switch: bool = False) -> None:
        self.current = current
        self.releases = {current: 0} if current else {}
        self.bad: set[str] = set()
        self.restarts = 0
        self.crash = crash_after_switch
        self.active = "active"
        self.crashing = False

    def handler(self, cmd: Cmd):
        text = cmd.display()
        if 'echo "current' in text or "echo 'current" in text or "readlink" in text:
            lines = [f"current /opt/opsctl/services/ref-shadow/releases/{self.current}" if self.current else "current "]
            lines += [f"release {r} {int(r in self.bad)} 1" for r in sorted(self.releases)]
            return (0, "\n".join(lines) + "\n", "")
        if text.startswith("systemctl show"):
            shown = self.restarts
            if self.crashing:
                self.restarts += 1  # the server dies after the baseline read; systemd restarts it
            return (0, f"ActiveState={self.active}\nSubState=running\nResult=success\nNRestarts={shown}\n", "")
        if "ln -sfn releases/" in text:
            self.current = text.split("releases/")[1].split()[0]
            self.releases.setdefault(self.current, 0)
            return (0, "", "")
        if text.startswith("systemctl restart"):
            self.crashing = self.crash and self.current != OLD
            return (0, "", "")
        if "/BAD" in text:
            self.bad.add(text.split("releases/")[1].split("/")[0])
            return (0, "", "")
        if "--help" in text:
            return (0, HELP, "")
        if "opsctl-args-ok" in text:  # the value pre-flight: the server's own parser accepted the flags
            return (0, "opsctl-args-ok\n", "")
        if text.startswith("sha256sum"):
            return (1, "", "No such file")
        return (0, "", "")


def _http(health_ok=lambda: True) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            if not health_ok():
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "4"}, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 1},
            },
        )

    return httpx.Client(transport=httpx.MockTransport(handle))


@pytest.fixture
def ctx_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k3y-value-never-shown")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inv = load_inventory(GOLDEN)
    host = inv.hosts[0]
    service = host.service("ref-shadow")
    wheel_file = tmp_path / "ddtree_runtime-0.1.0-py3-none-any.whl"
    wheel_file.write_text("wheel")
    wheel = RuntimeWheel(wheel_file, "f" * 64)
    said: list[str] = []

    def make(box: Box, svc=service, health_ok=lambda: True):
        fake = FakeHost(host.name, handler=box.handler)
        ctx = ServiceContext(host, svc, fake, _http(health_ok), threading.Event(), said.append, now=NOW)
        return ctx, fake

    return make, wheel, said


def _live_steps(fake: FakeHost) -> list[str]:
    keys = ("ln -sfn", "install -m 0644", "daemon-reload", "systemctl restart", "systemd-analyze verify", "pip install")
    return [next(k for k in keys if k in c) for c in fake.ran if any(k in c for k in keys)]


def test_first_deploy_in_order(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(None)
    ctx, fake = make(box)
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.DEPLOYED, result.message
    assert _live_steps(fake) == [
        "pip install", "systemd-analyze verify", "ln -sfn", "install -m 0644", "daemon-reload", "systemctl restart",
    ]  # fmt: skip
    rid = result.release
    assert rid.startswith("20261129T223000Z-") and box.current == rid
    files = {p.rsplit("/", 1)[-1]: mode for p, (_, mode) in fake.files.items() if rid in p}
    assert files == {
        "opsctl-ref-shadow.service": 0o644, "env": 0o600, "server.yaml": 0o600, "manifest.json": 0o644,
        "secrets.fp": 0o600,
    }  # fmt: skip
    fp = next(t for p, (t, _) in fake.files.items() if p.endswith("secrets.fp"))
    assert fp.startswith("v1:") and "k3y-value-never-shown" not in fp
    assert not any("k3y-value-never-shown" in c for c in fake.ran)  # secrets only inside 0600 files
    manifest = next(t for p, (t, _) in fake.files.items() if p.endswith("manifest.json"))
    assert '"mode": "shadow"' in manifest and "k3y-value-never-shown" not in manifest
    assert any("audit.log" in c for c in fake.ran)


def test_unchanged_restarts_nothing(ctx_for):
    make, wheel, _ = ctx_for
    ctx, fake = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)
    ctx, fake = make(box)
    again = flow.deploy_service(ctx, wheel, SETTINGS)
    assert again.outcome is Outcome.UNCHANGED and again.release == first.release
    assert _live_steps(fake) == [] and box.restarts == 0


def test_same_config_but_model_changed_under_the_service_restarts_it(ctx_for):
    # Provision repaired a model file under a running service; the config hash is the same, but the
    # process still maps the old file: the deploy must not say `unchanged`.
    make, wheel, said = ctx_for
    ctx, _ = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)
    ctx, fake = make(box)
    state = (
        "start Tue 2026-12-01 05:30:00.000000 UTC\nmodel 1 /dev/shm/Qwen3-8B\n"
        "file 100 1796103005.0 model.safetensors\n"  # written five seconds after the start
    )

    def handler(cmd: Cmd):
        return (0, state, "") if "ExecMainStartTimestamp" in cmd.display() else box.handler(cmd)

    fake.handler = handler
    again = flow.deploy_service(ctx, wheel, SETTINGS)
    assert again.outcome is Outcome.DEPLOYED and again.release != first.release
    assert again.release[-12:] == first.release[-12:] and box.restarts == 0 and box.current == again.release
    assert any("changed under the running service" in line for line in said)


def test_unchanged_but_still_starting_waits_for_health(ctx_for):
    # After a reboot the unit is enabled and starting, but the model is still loading: not a failure.
    make, wheel, said = ctx_for
    ctx, _ = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)  # active/running (Type=simple) while the model loads
    probes = iter([False, False, False])
    ctx, fake = make(box, health_ok=lambda: next(probes, True))
    again = flow.deploy_service(ctx, wheel, SETTINGS)
    assert again.outcome is Outcome.UNCHANGED and "was still starting" in again.message, again.message
    assert _live_steps(fake) == [] and any("waiting" in line for line in said)


def test_unchanged_but_dead_fails_with_the_fix(ctx_for):
    make, wheel, _ = ctx_for
    ctx, _ = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)
    box.active = "failed"
    ctx, fake = make(box, health_ok=lambda: False)
    again = flow.deploy_service(ctx, wheel, SETTINGS)
    assert again.outcome is Outcome.FAILED and "--service ref-shadow --force` restarts it" in again.message
    assert _live_steps(fake) == []


def test_new_release_records_what_it_replaced(ctx_for):
    make, wheel, _ = ctx_for
    ctx, fake = make(Box(OLD))
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.DEPLOYED, result.message
    text, _ = fake.files[f"/opt/opsctl/services/ref-shadow/releases/{result.release}/previous"]
    assert text.strip() == OLD


def test_rotated_api_key_deploys_a_new_release(ctx_for, monkeypatch):
    make, wheel, said = ctx_for
    ctx, fake = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "rotated-k3y-value")
    box = Box(first.release)
    ctx, fake2 = make(box)
    fake2.files.update(fake.files)  # the host keeps the first release's files
    plan = flow.deploy_service(ctx, wheel, replace(SETTINGS, plan=True))
    assert plan.outcome is Outcome.PLANNED and "API key changed" in plan.message
    rotated = flow.deploy_service(ctx, wheel, replace(SETTINGS, plan=False))
    assert rotated.outcome is Outcome.DEPLOYED, rotated.message
    # Same configuration hash (secrets are masked in it), a new release, restarted.
    assert rotated.release != first.release and rotated.release[-12:] == first.release[-12:]
    assert box.current == rotated.release and "systemctl restart" in " ".join(fake2.ran)
    assert any("API key changed" in line for line in said)
    assert not any("rotated-k3y-value" in c for c in fake2.ran)
    box3 = Box(rotated.release)
    ctx, fake3 = make(box3)
    fake3.files.update(fake2.files)
    again = flow.deploy_service(ctx, wheel, SETTINGS)
    assert again.outcome is Outcome.UNCHANGED and box3.restarts == 0


def test_missing_model_after_a_failed_restore_unit_is_not_called_a_plain_recopy(ctx_for):
    """After the boot-time restore unit failed (its host-side source is what failed), the refusal names the unit
    and its result and says provision may refuse the source; never "nothing else is needed"."""
    make, wheel, _ = ctx_for
    box = Box(OLD)

    def handler(cmd: Cmd):
        text = cmd.display()
        if "test -f" in text and "config.json" in text:
            return (0, "/dev/shm/Qwen3-8B\n", "")
        if "systemctl show" in text and "opsctl-model-Qwen3-8B.service" in text:
            return (0, "ActiveState=failed\nSubState=failed\nResult=exit-code\n", "")
        return box.handler(cmd)

    ctx, fake = make(box)
    fake.handler = handler
    from opsctl.errors import DeployError

    with pytest.raises(DeployError) as err:
        flow.deploy_service(ctx, wheel, SETTINGS)
    line = err.value.one_line()
    assert "nothing else is needed" not in line
    assert "the restore unit failed at boot: opsctl-model-Qwen3-8B.service (exit-code)" in line
    assert "`journalctl -b -u opsctl-model-Qwen3-8B.service` on the host says why" in line
    assert "or refuses a source that is not the accepted model" in line
    assert fake.files == {} and _live_steps(fake) == [] and box.current == OLD
    # the restore unit did not fail (not run yet, or no boot since): provision is all it takes
    box2 = Box(OLD)
    ctx2, fake2 = make(box2)
    fake2.handler = lambda cmd: (0, "/dev/shm/Qwen3-8B\n", "") if "test -f" in cmd.display() else box2.handler(cmd)
    with pytest.raises(DeployError) as plain:
        flow.deploy_service(ctx2, wheel, SETTINGS)
    assert plain.value.one_line().endswith("restarts the services using it; nothing else is needed)")


def test_missing_model_refused_before_anything_changes(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)

    def handler(cmd: Cmd):
        text = cmd.display()
        if "test -f" in text and "config.json" in text:
            return (0, "/dev/shm/tiny-qwen3\n", "")
        return box.handler(cmd)

    ctx, fake = make(box)
    fake.handler = handler
    plan = flow.deploy_service(ctx, wheel, replace(SETTINGS, plan=True))
    assert any(line.startswith("WARNING model /dev/shm/tiny-qwen3 is not on the host") for line in plan.plan)
    from opsctl.errors import DeployError

    with pytest.raises(DeployError, match=r"not on the host.*reboot") as err:
        flow.deploy_service(ctx, wheel, SETTINGS)
    assert "opsctl provision" in err.value.one_line()
    assert fake.files == {} and _live_steps(fake) == [] and box.current == OLD


def test_unknown_flag_refused_before_switch(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    svc = load_inventory(GOLDEN).hosts[0].service("ref-shadow")
    ctx, fake = make(box, replace(svc, extra_args=("--no-such-flag",)))
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.FAILED and "--no-such-flag" in result.message
    assert "nothing switched" in result.message
    assert box.current == OLD and "ln -sfn" not in " ".join(fake.ran) and "systemctl restart" not in " ".join(fake.ran)
    assert result.release in box.bad


def test_failed_gate_rolls_back_and_marks_bad(ctx_for):
    make, wheel, said = ctx_for
    box = Box(OLD, crash_after_switch=True)
    ctx, fake = make(box)
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert "NRestarts" in result.message and f"rolled back to {OLD}" in result.message
    assert box.current == OLD and result.release in box.bad
    assert _live_steps(fake)[-4:] == ["ln -sfn", "install -m 0644", "daemon-reload", "systemctl restart"]
    assert any("journalctl -u opsctl-ref-shadow.service" in c for c in fake.ran)  # journal tail fetched
    assert any(line.startswith("FAILED: health gate failed") for line in said)


def test_cancel_before_switch(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)
    ctx.cancel.set()
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.INTERRUPTED and box.current == OLD
    assert "systemctl restart" not in " ".join(fake.ran)


def test_bad_flag_value_refused_before_switch(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)

    def handler(cmd: Cmd):
        if "opsctl-args-ok" in cmd.display():
            return (2, "", "usage: ddtree-serve ...\nddtree-serve: error: --port 0: must be in 1..65535\n")
        return box.handler(cmd)

    fake.handler = handler
    result = flow.deploy_service(ctx, wheel, replace(SETTINGS, force=True))
    assert result.outcome is Outcome.FAILED and "nothing switched" in result.message
    assert "refuses this release's flag values: ddtree-serve: error: --port 0: must be in 1..65535" in result.message
    assert box.current == OLD and "systemctl restart" not in " ".join(fake.ran)
    checks = [c for c in fake.ran if "opsctl-args-ok" in c]
    assert checks and "k3y-value-never-shown" not in checks[0]  # the masked render: no secret on a command line
    # --plan runs the same pre-flight (with the current release's runtime) and fails the same way
    planned = flow.deploy_service(ctx, wheel, replace(SETTINGS, plan=True, force=True))
    assert planned.outcome is Outcome.FAILED and "pre-flight would refuse" in planned.message


@pytest.mark.parametrize("during", ["--help", "systemd-analyze verify"])
def test_cancel_during_preflight_or_verify_restarts_nothing(ctx_for, during):
    # Ctrl-C during the pre-flight or `systemd-analyze verify` restarted the healthy serving release.
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)

    def handler(cmd: Cmd):
        if during in cmd.display():
            ctx.cancel.set()  # the Ctrl-C arrives while this command runs
        return box.handler(cmd)

    fake.handler = handler
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.INTERRUPTED and "nothing switched" in result.message
    assert box.current == OLD and result.release in box.bad
    assert not any(k in " ".join(fake.ran) for k in ("systemctl restart", "ln -sfn", "daemon-reload"))


def test_disk_full_mid_staging_is_one_bounded_line_and_the_partial_release_goes(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)
    noise = "x" * 21000  # pip's output on a full disk ran to 21 KB, all of it once in the message

    def handler(cmd: Cmd):
        if "pip install" in cmd.display():
            return (1, "", f"ERROR: {noise} OSError: [Errno 28] No space left on device")
        return box.handler(cmd)

    fake.handler = handler
    result = flow.deploy_service(ctx, wheel, replace(SETTINGS, force=True))
    assert result.outcome is Outcome.FAILED and len(result.message) < 600, len(result.message)
    assert "No space left on device" in result.message and "free space under /opt/opsctl" in result.message
    assert any(c.startswith("rm -rf -- /opt/opsctl/services/ref-shadow/releases/") for c in fake.ran)
    assert result.release not in box.bad and box.current == OLD


def test_free_space_checked_before_staging(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)

    def handler(cmd: Cmd):
        if "df -P -B1" in cmd.display():
            df = "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/vda1 10000000 9990000 10000 99% /\n"
            return (0, df, "")
        return box.handler(cmd)

    fake.handler = handler
    with pytest.raises(OpsctlError, match=r"only .* free in / .*nothing was changed") as err:
        flow.deploy_service(ctx, wheel, replace(SETTINGS, force=True))
    assert "free space on /" in str(err.value.hint)
    assert not any(k in " ".join(fake.ran) for k in ("mkdir -p -- /opt/opsctl/services/ref-shadow/releases/", "pip"))


def test_plan_changes_nothing(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)
    result = flow.deploy_service(ctx, wheel, replace(SETTINGS, plan=True))
    assert result.outcome is Outcome.PLANNED and result.plan[0].startswith(f"release {OLD} -> ")
    assert fake.files == {} and _live_steps(fake) == [] and box.current == OLD
    assert not any("k3y-value-never-shown" in line for line in result.plan)


def test_rollback_refuses_without_target(ctx_for):
    make, _, _ = ctx_for
    ctx, _ = make(Box(OLD))
    from opsctl.errors import DeployError

    with pytest.raises(DeployError, match="nothing to roll back to"):
        flow.rollback_service(ctx, SETTINGS)


def test_cancel_after_switch_restores_previous_and_waits_for_it(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(OLD)
    ctx, fake = make(box)
    real_restart = box.handler

    def handler(cmd):
        answer = real_restart(cmd)
        if cmd.display().startswith("systemctl restart") and box.current != OLD:
            ctx.cancel.set()  # Ctrl-C right after the new release was started
        return answer

    fake.handler = handler
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.INTERRUPTED, result.message
    assert f"{OLD} restored and healthy" in result.message
    assert box.current == OLD and result.release in box.bad


def test_first_deploy_failing_stops_and_removes(ctx_for):
    make, wheel, _ = ctx_for
    box = Box(None, crash_after_switch=True)
    ctx, fake = make(box)
    result = flow.deploy_service(ctx, wheel, SETTINGS)
    assert result.outcome is Outcome.FAILED and "no previous release to roll back to" in result.message
    ran = " ".join(fake.ran)
    assert "systemctl disable --now --quiet -- opsctl-ref-shadow.service" in ran
    assert "rm -f -- /opt/opsctl/services/ref-shadow/current /etc/systemd/system/opsctl-ref-shadow.service" in ran
    assert result.release in box.bad


def test_corrupt_model_is_refused_before_anything_restarts_and_nothing_is_marked_bad(ctx_for):
    # A byte flipped in place (same size, written after provision verified the model). Before the fix
    # the deploy restarted into it (a new release crash-loaded, so did the rollback, a good config went BAD);
    # now that one file is hashed, found corrupt, and the deploy (and its plan) refuse before anything changes.
    from opsctl.errors import DeployError
    from opsctl.facts.manifest import FileEntry, Manifest

    make, wheel, _ = ctx_for
    box = Box(OLD)
    manifest = Manifest({"model.safetensors": FileEntry(100, "a" * 64)}).to_json().replace("\n", "")
    state = (
        f"start Tue 2026-12-01 05:30:00.000000 UTC\nmodel 1 /dev/shm/Qwen3-8B\nmanifest {manifest}\n"
        "verified 1796102000.0\nfile 100 1796103005.0 model.safetensors\n"  # written after start and verification
    )

    def handler(cmd: Cmd):
        text = cmd.display()
        if "ExecMainStartTimestamp" in text:
            return (0, state, "")
        if "sha256sum -- model.safetensors" in text:
            return (0, "b" * 64 + "  model.safetensors\n", "")
        return box.handler(cmd)

    ctx, fake = make(box)
    fake.handler = handler
    for settings in (replace(SETTINGS, plan=True), SETTINGS, replace(SETTINGS, force=True)):
        with pytest.raises(DeployError) as err:
            flow.deploy_service(ctx, wheel, settings)
        line = err.value.one_line()
        assert "model /dev/shm/Qwen3-8B is corrupt" in line and "model.safetensors" in line, line
        assert "nothing was changed" in line and "`opsctl provision -i INVENTORY --host" in line
    assert fake.files == {} and _live_steps(fake) == [] and box.current == OLD and not box.bad


def test_rollback_to_a_release_that_fails_restores_current_with_a_restoring_gate(ctx_for, monkeypatch):
    """`rollback` runs the corridor's roll-back-to, as the router's does: the target marked bad, the release that
    was current restored and re-checked as a restore is (short readiness delay, Ctrl-C cannot stop it)."""
    make, _, said = ctx_for
    target, current = OLD, "20261129T210000Z-bbbbbbbbbbbb"
    box = Box(current)
    box.releases[target] = 0
    ctx, _ = make(box)
    gates: list[tuple[float | None, bool]] = []
    verdicts = iter([False, True])

    def gate(ctx, settings, baseline, cancellable=True):
        gates.append((settings.readiness_delay, cancellable))
        ok = next(verdicts)
        return GateResult(ok, "healthy" if ok else "no HTTP 200", 0.1 if ok else None, None, None)

    monkeypatch.setattr(flow, "_gate", gate)
    monkeypatch.setattr(flow.guards, "model_verdicts", lambda ctx: [])
    settings = replace(SETTINGS, readiness_delay=30.0, allow_old_secrets=True)
    result = flow.rollback_service(ctx, settings, to=target)
    assert result.outcome is Outcome.FAILED, result.message
    assert result.message == f"{target} failed its health gate (no HTTP 200); {current} restored"
    assert gates == [(30.0, True), (5.0, False)]
    assert target in box.bad and box.current == current
    assert f"rolling back {current} -> {target}" in said


def test_an_unchanged_service_that_does_not_serve_names_the_command_that_restarts_it(ctx_for) -> None:
    """Its hint was `opsctl deploy --force` (every selected service) with no inventory; now the printed command is
    this service's, and running it restarts the service with a new release of the same configuration."""
    make, wheel, _said = ctx_for
    ctx, first_host = make(Box(None))
    first = flow.deploy_service(ctx, wheel, SETTINGS)
    box = Box(first.release)
    box.active = "inactive"  # stopped: not still starting
    serving = [False]
    ctx, fake = make(box, health_ok=lambda: serving[0])
    fake.files.update(first_host.files)
    down = flow.deploy_service(ctx, wheel, SETTINGS)
    assert down.outcome is Outcome.FAILED
    h, s = ctx.host.name, ctx.service.name
    assert down.message.endswith(
        f"`opsctl deploy -i INVENTORY --host {h} --service {s} --force` restarts it (a new release), "
        f"`opsctl logs -i INVENTORY --host {h} --service {s}` shows why"
    ), down.message
    serving[0] = True  # the command it names: --force, this host and service
    box.active = "active"
    forced = flow.deploy_service(ctx, wheel, replace(SETTINGS, force=True))
    assert forced.outcome is Outcome.DEPLOYED and forced.release != first.release, forced.message
    assert "systemctl restart" in _live_steps(fake)
