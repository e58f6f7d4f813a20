"""The provision runner: step order, stop rules, statuses and exit codes (operations stubbed, FakeHost)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsctl import provision as prov
from opsctl.commands import Cmd
from opsctl.errors import ExitCode, ProvisionError
from opsctl.inventory.model import Host, SshConfig
from opsctl.ops.base import Context, Plan, execute
from opsctl.provision import HostReport, HostStatus, Result, Settings, StepReport, StepStatus
from opsctl.remote.fake import FakeHost


@dataclass
class Stub:
    name: str
    actions: tuple[Cmd, ...] = ()
    reboot: bool = False
    fail: bool = False

    def plan(self, ctx: Context) -> Plan:
        if self.fail:
            raise ProvisionError(f"{self.name} broke", "fix it")
        return Plan(self.name, self.actions, (f"{self.name} note",), reboot_required=self.reboot)

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions)
        return Plan(self.name, reboot_required=self.reboot and not ctx.options.reboot)


HOST = Host("h1", "10.0.0.1", SshConfig(), 0, "/v", "python3", "0.5.23", None, None)


def run(monkeypatch: pytest.MonkeyPatch, stubs: list[Stub], plan_only: bool) -> tuple[HostReport, FakeHost]:
    monkeypatch.setattr(prov, "OPERATIONS", {s.name: (lambda s=s: s) for s in stubs})
    remote = FakeHost("h1")
    report = prov.provision_host(HOST, remote, [s.name for s in stubs], Settings(plan_only=plan_only), prov.Artifacts())
    return report, remote


def test_plan_runs_nothing_and_reports_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    report, remote = run(monkeypatch, [Stub("a"), Stub("b", (Cmd.of("touch", "/x"),))], plan_only=True)
    assert [(s.op, s.status) for s in report.steps] == [("a", StepStatus.UNCHANGED), ("b", StepStatus.PENDING)]
    assert report.steps[1].commands == ("touch /x",)
    assert remote.ran == []
    assert report.status is HostStatus.PENDING
    assert Result(True, (report,)).exit_code is ExitCode.CHANGES_PENDING


def test_apply_runs_commands_and_reports_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    report, remote = run(monkeypatch, [Stub("a"), Stub("b", (Cmd.of("touch", "/x"),))], plan_only=False)
    assert remote.ran == ["touch /x"]
    assert report.status is HostStatus.CHANGED
    assert report.changes == 1
    assert Result(False, (report,)).exit_code is ExitCode.OK


def test_failure_stops_the_host_and_skips_later_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    report, _ = run(monkeypatch, [Stub("a", fail=True), Stub("b", (Cmd.of("touch", "/x"),))], plan_only=False)
    assert [(s.op, s.status) for s in report.steps] == [("a", StepStatus.FAILED), ("b", StepStatus.SKIPPED)]
    assert (report.steps[0].error, report.steps[0].hint) == ("a broke", "fix it")
    assert Result(False, (report,)).exit_code is ExitCode.ERROR


class _Breaks(Stub):
    """A step whose apply fails after its plan passed (the host was being changed)."""

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        raise ProvisionError(f"{self.name}: copy failed", "run provision again")


def test_a_refusal_and_a_failure_are_audited_through_the_one_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsctl.kernel import audit

    refused, remote = run(monkeypatch, [Stub("model_sync", fail=True)], plan_only=False)
    assert refused.steps[0].status is StepStatus.FAILED
    (line,) = audit.local_log_path().read_text().splitlines()
    assert "host=h1" in line and "action=provision" in line and "result=refused" in line
    assert 'detail="model_sync: model_sync broke (fix it)"' in line
    (host_copy,) = [c for c in remote.ran if audit.HOST_LOG in c]  # the host's own log got the same line
    assert "result=refused" in host_copy
    run(monkeypatch, [_Breaks("model_sync", (Cmd.of("touch", "/x"),))], plan_only=False)
    failed = audit.local_log_path().read_text().splitlines()[-1]
    assert "result=failed" in failed and "model_sync: copy failed" in failed
    before = audit.local_log_path().read_text()
    run(monkeypatch, [Stub("model_sync", fail=True)], plan_only=True)  # --plan writes nothing
    assert audit.local_log_path().read_text() == before


def test_reboot_required_stops_apply_but_not_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    stubs = [Stub("drv", (Cmd.of("apt-get", "install"),), reboot=True), Stub("venv", (Cmd.of("pip"),))]
    report, _ = run(monkeypatch, stubs, plan_only=False)
    assert [s.status for s in report.steps] == [StepStatus.REBOOT, StepStatus.SKIPPED]
    assert Result(False, (report,)).exit_code is ExitCode.REBOOT_REQUIRED
    planned, _ = run(monkeypatch, stubs, plan_only=True)
    assert [s.status for s in planned.steps] == [StepStatus.REBOOT, StepStatus.PENDING]
    assert Result(True, (planned,)).exit_code is ExitCode.REBOOT_REQUIRED


def test_one_failed_host_does_not_hide_the_others() -> None:
    ok = HostReport("a", (StepReport("x", StepStatus.UNCHANGED),))
    bad = HostReport("b", error="b: unreachable: timed out")
    result = Result(False, (ok, bad))
    assert [h.status for h in result.hosts] == [HostStatus.UNCHANGED, HostStatus.FAILED]
    assert result.exit_code is ExitCode.ERROR


def test_playbook_lists_every_operation_in_order() -> None:
    assert prov.load_playbook(prov.PLAYBOOK) == (
        "gpu_driver", "cuda_toolkit", "python_venv", "runtime_wheel", "router_wheels", "model_sync", "model_restore"
    )  # fmt: skip


def test_bad_playbooks(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("steps: [gpu_driver, make_coffee]\n")
    with pytest.raises(ProvisionError, match="unknown step 'make_coffee'"):
        prov.load_playbook(bad)
    bad.write_text("steps: gpu_driver\n")
    with pytest.raises(ProvisionError, match="must be a list"):
        prov.load_playbook(bad)
    with pytest.raises(ProvisionError, match="cannot read playbook"):
        prov.load_playbook(tmp_path / "missing.yaml")


def test_whole_run_with_fake_hosts_in_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prov, "OPERATIONS", {"a": lambda: Stub("a", (Cmd.of("true"),))})
    playbook = Path(__file__).parent / "_pb.yaml"
    hosts = [HOST, Host("h2", "10.0.0.2", SshConfig(), 0, "/v", "python3", "0.5.23", None, None)]
    fakes: dict[str, FakeHost] = {}

    def connect(spec: Host) -> FakeHost:
        fakes[spec.name] = FakeHost(spec.name)
        return fakes[spec.name]

    monkeypatch.setattr(prov, "load_playbook", lambda path: ("a",))
    result = prov.provision(hosts, Settings(playbook=playbook), connect=connect)
    assert [(h.host, h.status) for h in result.hosts] == [("h1", HostStatus.CHANGED), ("h2", HostStatus.CHANGED)]
    assert all(f.closed and f.ran == ["true"] for f in fakes.values())


def test_runtime_wheel_plan_is_content_addressed(tmp_path: Path) -> None:
    from opsctl.ops.runtime_wheel import PushRuntimeWheel
    from opsctl.wheel import RuntimeWheel

    wheel = tmp_path / "ddtree_runtime-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel bytes")
    digest = "67c0d8f7de19e30c2d5891030a0b37cbfcdd240852b53055c0b28290ad52290b"
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == digest
    remote_file = f"/opt/opsctl/wheels/{digest[:16]}/{wheel.name}"
    remote = FakeHost("h1", answers={f"sha256sum {remote_file}": (1, "", "No such file")}, default=None)
    ctx = Context(HOST, remote, artifacts=prov.Artifacts(runtime_wheel=RuntimeWheel.of(wheel)))
    plan = PushRuntimeWheel().plan(ctx)
    assert plan.commands() == [f"sudo mkdir -p /opt/opsctl/wheels/{digest[:16]}", f"push {wheel} -> {remote_file}"]
    remote.answers = {f"sha256sum {remote_file}": (0, f"{digest}  {remote_file}\n", "")}
    assert PushRuntimeWheel().plan(ctx).actions == ()
