"""Deploy (and roll back) one router on its host through the services' walk (`deploy/skeleton.py`): releases,
the pending-gates marker, free-space, incomplete-release and drift checks, switch, restart, health gate,
automatic rollback, the audit lines. `RouterDeploy` is the router's side of it. The caller holds the host's
deploy lock.

A router release is `/opt/opsctl/services/router-<name>/releases/<id>/` with the unit, env, router.json
(0600), launch.py, the lock it installed (requirements.txt) and site/ (sglang-router and its dependencies,
`pip install --target` from the router wheelhouse). Its id hashes the rendered files (secrets masked) and the
lock, so an unchanged router is never restarted. Restarting a router is a short outage for its clients: it
happens only when the router's own configuration changed (a service deploy never restarts it).

Health gate: the unit active, NRestarts unmoved, `/health` 200, then after the readiness delay all again;
plus `/readiness` (at least one healthy worker) when any of its workers answers /health, so a router that
cannot reach its workers fails its gate instead of going live serving nobody.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from opsctl import __version__, systemd
from opsctl.commands import Cmd, sh
from opsctl.deploy import corridor, drift, release, skeleton
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.preflight import looks_like_help, unknown_flags
from opsctl.deploy.release import Manifest, ReleaseFacts, ServicePaths
from opsctl.errors import DeployError, OpsctlError
from opsctl.health import HealthProbe, probe
from opsctl.inventory.model import Inventory, Router
from opsctl.kernel import audit
from opsctl.kernel.gate import GateConfig, health_gate, readiness_gate
from opsctl.kernel.locks import router_lock
from opsctl.ops.router_wheels import REMOTE_ROUTER_WHEELHOUSE
from opsctl.remote.base import Connection
from opsctl.render import Secrets
from opsctl.router.render import render_router, router_url, worker_urls

LIVE_TIMEOUT_S = 60.0
READINESS_TIMEOUT_S = 60.0  # workers answer /health but the router has none healthy: it cannot reach them
LOCK_FILE = "requirements.txt"


@dataclass
class RouterResult:
    host: str
    router: str
    outcome: Outcome
    release: str | None = None
    previous: str | None = None
    message: str = ""
    journal_tail: str = ""
    plan: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def install_cmd(venv: str, requirements: str, site: str, offline: bool) -> Cmd:
    """sglang-router and its dependencies into the release's own site dir (from the pushed wheelhouse)."""
    argv = [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    argv += ["--no-index"] if offline else []
    argv += ["--find-links", REMOTE_ROUTER_WHEELHOUSE, "--target", site, "-r", requirements]
    return Cmd.of(*argv, sudo=True)


def import_check_cmd(venv: str, site: str) -> Cmd:
    """The release's router imports and knows its flags (its own --help, with the release's site dir)."""
    return sh(
        f"PYTHONPATH={shlex.quote(site)} {shlex.quote(venv + '/bin/python')} -m sglang_router.launch_router "
        "--help 2>&1",
        sudo=True,
    )


class RouterDeploy:
    """One router on one connected host."""

    def __init__(
        self,
        inventory: Inventory,
        router: Router,
        remote: Connection,
        http: httpx.Client,
        say: Callable[[str], None] = print,
    ) -> None:
        self.inventory = inventory
        self.router = router
        self.remote = remote
        self.http = http
        self.say = say
        self.host = inventory.host(router.host)
        self.paths = ServicePaths(router.unit_base)
        self.lock = router_lock(router.version)

    # ------------------------------------------------------------------ helpers
    def _run(self, cmd: Cmd, check: bool = True, timeout: float | None = LIVE_TIMEOUT_S) -> str:
        return self.remote.run(cmd, timeout=timeout, check=check).stdout

    def audit(self, action: str, release_id: str | None, result: str, detail: str = "") -> None:
        audit.record(self.host, self.router.unit_base, action, release_id, result, detail, conn=self.remote)

    def facts(self) -> ReleaseFacts:
        return release.parse_release_facts(self._run(release.facts_cmd(self.paths)))

    def config_hash(self) -> str:
        rendered = render_router(self.inventory, self.router, release.PLACEHOLDER_ID)
        files = {k: v.replace(release.PLACEHOLDER_ID, "<release>") for k, (v, _) in rendered.files.items()}
        files[LOCK_FILE] = self.lock.text
        argv = tuple(a.replace(release.PLACEHOLDER_ID, "<release>") for a in rendered.exec_start)
        return release.config_hash(files, argv, self.lock.sha256)

    def _gate(self, baseline: int, restoring: bool = False) -> tuple[bool, str, float]:
        url = router_url(self.inventory, self.router)
        delay = self.router.readiness_delay
        config = GateConfig(
            timeout=self.router.health_timeout,
            readiness_delay=min(delay, 5.0) if restoring else delay,  # restoring: it served before
            poll_s=0.5,
        )
        gate = health_gate(
            read_unit=lambda: systemd.parse_show(self._run(systemd.show_cmd(self.paths.unit_name))),
            probe=lambda: probe(self.http, url + "/health", timeout=5.0),
            baseline_restarts=baseline,
            config=config,
        )
        if not gate.ok:
            return False, gate.reason, 0.0
        reason = self._ready(url)
        return (not reason), reason or "healthy", gate.time_to_healthy or 0.0

    def _ready(self, url: str) -> str:
        """ "" when the router serves: /readiness 200, or none of its workers is up anyway (first deploy)."""
        return readiness_gate(
            ready=lambda: probe(self.http, url + "/readiness", timeout=5.0),
            upstream_up=lambda: any(
                probe(self.http, w + "/health", timeout=3.0).ok for w in _urls(self.inventory, self.router)
            ),
            timeout=READINESS_TIMEOUT_S,
        )

    def restart(self, release_id: str, restoring: bool = False) -> int:
        """The corridor's go-live (restore) steps, as for a service; NRestarts right after the restart."""
        p = self.paths
        steps = corridor.restore(p, release_id) if restoring else corridor.go_live(p, release_id)
        corridor.run_steps(lambda cmd, check: self._run(cmd, check=check), steps)
        return systemd.parse_show(self._run(systemd.show_cmd(p.unit_name))).n_restarts

    # ------------------------------------------------------------------ the corridor's Releasable
    noun = "router"

    def gate(self, baseline: int, restoring: bool = False) -> tuple[bool, str, float]:
        return self._gate(baseline, restoring)

    def unit_state(self) -> systemd.UnitState:
        return systemd.parse_show(self._run(systemd.show_cmd(self.paths.unit_name)))

    def run(self, cmd: Cmd, check: bool = True) -> str:
        return self._run(cmd, check=check)

    def mark_bad(self, release_id: str, why: str) -> None:
        try:
            self._run(release.mark_bad_cmd(self.paths, release_id, why), check=False)
        except OpsctlError:
            pass  # the host is gone: the release stays incomplete or unmarked, and the next deploy judges it

    def teardown(self) -> None:
        corridor.run_steps(lambda cmd, check: self._run(cmd, check=check), corridor.teardown(self.paths))

    def journal_tail(self, lines: int = 30) -> str:
        try:
            return self._run(systemd.journal_tail_cmd(self.paths.unit_name, lines), check=False, timeout=30).rstrip()
        except OpsctlError:
            return ""

    def _running(self) -> bool:
        return self.unit_state().active_state in ("active", "activating", "reloading")

    def _start_again(self, current: str) -> tuple[bool, str]:
        """An unchanged router whose unit is stopped: its current release goes live again (reset-failed, the same
        go-live steps as a restore) and is gated. (healthy, a note for the message)."""
        self.say(
            f"unchanged config; {self.paths.unit_name} is {self.unit_state().describe()}: starting release {current}"
        )
        try:
            ok, reason, seconds = self._gate(self.restart(current, restoring=True), restoring=True)
        except OpsctlError as exc:
            ok, reason, seconds = False, exc.one_line(), 0.0
        self.audit("deploy", current, "started-again" if ok else "failed", "" if ok else reason)
        return (
            ok,
            f"; it was stopped: started again, healthy after {seconds:.1f}s" if ok else f"; started again: {reason}",
        )

    # ------------------------------------------------------------------ the deploy walk's DeployTarget
    gates = "health, /readiness"
    start_note = ""

    @property
    def conn(self) -> Connection:
        return self.remote

    @property
    def host_name(self) -> str:
        return self.host.name

    def read_facts(self) -> ReleaseFacts:
        return self.facts()

    def render(self, facts: ReleaseFacts) -> tuple[str, str]:
        chash = self.config_hash()
        return release.unused_release_id(_now(), chash, {r.release_id for r in facts.releases}), chash

    def refuse_first(self) -> None:
        pass  # a router loads no model: nothing to refuse before its config is judged

    def redeploy_reasons(self, facts: ReleaseFacts, plan: bool) -> list[skeleton.Reason]:
        return []  # its secrets are in its hash (router.json); it loads no model

    def probe(self) -> HealthProbe:
        return probe(self.http, router_url(self.inventory, self.router) + "/health", timeout=5.0)

    def start_again(self, current: str) -> tuple[bool, str] | None:
        """Stopped (`systemctl stop`, out of restarts): the release it served is started again, gated."""
        return None if self._running() else self._start_again(current)

    def unhealthy_hint(self, current: str) -> str:
        name = self.router.name
        return (
            f"`opsctl logs -i INVENTORY --router {name}` shows why; `opsctl deploy -i INVENTORY --router {name} "
            "--force` deploys it as a new release"
        )

    def planned(self, facts: ReleaseFacts, new_id: str, why: str, result: skeleton.Result) -> None:
        rendered = render_router(self.inventory, self.router, new_id)
        result.message = f"would deploy router release {new_id} (current: {facts.current or 'none'}{why})"
        result.plan = [
            f"release {facts.current or '(none)'} -> {new_id}",
            f"install {self.lock.name} into {self.paths.site(new_id)}",
            f"go live (its clients see a short outage while {self.paths.unit_name} restarts):",
            *corridor.plan_lines(corridor.go_live(self.paths, new_id)),
            "health gate; /readiness; on failure: "
            + (f"restore {facts.current} (reset-failed, then the same steps)" if facts.current else "teardown:"),
            *([] if facts.current else corridor.plan_lines(corridor.teardown(self.paths))),
            "router " + " ".join(rendered.argv),
        ]

    def refuse_before_change(self) -> None:
        pass  # nothing a router needs on its host beyond what staging checks

    def check_cancel(self) -> None:
        pass  # a router's deploy is not cancelled midway (its staging is short)

    def stage(self, new_id: str, facts: ReleaseFacts, config_hash: str) -> None:
        self._stage(new_id, config_hash, facts.current)

    def before_live(self) -> None:
        pass  # its clients see a short outage while it restarts; nothing to take it out of

    def live_gate(self, baseline: int, result: skeleton.Result) -> str:
        ok, reason, healthy_s = self._gate(baseline)
        if ok:
            result.timings["healthy_s"] = healthy_s
        return "" if ok else reason

    def audit_local(self, action: str, release_id: str | None, result: str, detail: str = "") -> None:
        audit.record(self.host, self.router.unit_base, action, release_id, result, detail)

    # ------------------------------------------------------------------ deploy
    def deploy(self, force: bool = False, plan: bool = False, keep: int = release.DEFAULT_KEEP) -> RouterResult:
        """The deploy walk (`skeleton.deploy`), the same as a service's, with the router's side above."""
        result = RouterResult(self.host.name, self.router.name, Outcome.FAILED)
        try:
            return skeleton.deploy(self, skeleton.Options(force=force, plan=plan, keep=keep), result)
        except DeployError as exc:  # a check refused it before anything changed: audited, as a service's refusal
            if not plan:
                self.audit("deploy", None, "refused", exc.one_line())
            raise

    def _stage(self, new_id: str, chash: str, previous: str | None) -> None:
        rendered = render_router(self.inventory, self.router, new_id, Secrets.REVEAL)
        self._run(Cmd.of("mkdir", "-p", "--", self.paths.release(new_id), sudo=True))
        for name, (text, mode) in rendered.files.items():
            self.remote.put_text(text, self.paths.release_file(new_id, name), mode)
        requirements = self.paths.release_file(new_id, LOCK_FILE)
        self.remote.put_text(self.lock.text, requirements, 0o644)
        if previous:
            self.remote.put_text(previous + "\n", self.paths.release_file(new_id, release.PREVIOUS), 0o644)
        offline = self.host.wheelhouse is not None
        self._run(install_cmd(self.host.venv, requirements, self.paths.site(new_id), offline), timeout=900)
        out = self.remote.run(import_check_cmd(self.host.venv, self.paths.site(new_id)), check=False, timeout=300)
        if not looks_like_help(out.stdout):
            last = (out.stdout.strip().splitlines() or [f"exit {out.exit_code}"])[-1]
            raise DeployError(f"sglang_router does not start on the host: {last}", "check the router wheelhouse")
        unknown = unknown_flags(rendered.argv, out.stdout)
        if unknown:
            raise DeployError(f"sglang-router {self.router.version} does not know {', '.join(unknown)}")
        masked = render_router(self.inventory, self.router, new_id)
        manifest = Manifest(
            release_id=new_id, service=self.router.unit_base, host=self.host.name, mode="router",
            engine=f"sglang-router-{self.router.version}", config_hash=chash, created_at=_now().strftime(
                "%Y-%m-%dT%H:%M:%SZ"), runtime_wheel=self.lock.name, runtime_sha256=self.lock.sha256,
            runtime_version=self.router.version, opsctl_version=__version__, argv=masked.exec_start,
            files=release.file_digests({k: v for k, (v, _) in masked.files.items()}),
        )  # fmt: skip
        self.remote.put_text(manifest.to_json(), f"{self.paths.release(new_id)}/{release.MANIFEST}", 0o644)
        verify = self.remote.run(systemd.verify_cmd(self.paths.release_unit(new_id)), check=False)
        if not verify.ok or verify.stdout.strip():
            raise DeployError(f"systemd-analyze verify rejected the router unit: {verify.stdout.strip()[:300]}")

    def rollback(self, to: str | None = None) -> RouterResult:
        result = RouterResult(self.host.name, self.router.name, Outcome.FAILED)
        facts = self.facts()
        result.previous = facts.current
        target = to or facts.rollback_target()
        entry = facts.entry(target) if target else None
        if target is None or entry is None or not entry.complete or target == facts.current:
            raise DeployError(
                f"router {self.router.name}: nothing to roll back to from {facts.current or 'none'}",
                "deploy a fixed configuration instead",
            )
        result.release = target
        # files of the target edited on the host since its deploy: said, as a service's rollback says it (what
        # goes live is not what was deployed; the next deploy of a fixed configuration writes them again)
        changed = drift.release_drift(self.remote, self.paths, [target], facts.current).get(target, [])
        for line in changed:
            self.say(f"rollback target drifted: {line}")
        result.outcome, result.message, result.journal_tail = corridor.roll_back_to(self, facts.current, target)
        if changed:
            result.message += f"; its files changed on the host since its deploy ({changed[0]})"
        return result


def _urls(inventory: Inventory, router: Router) -> tuple[str, ...]:
    return worker_urls(inventory, router)


def _now() -> datetime:
    return datetime.now(UTC)
