"""Deploy (and roll back) one router on its host, like a service: releases, switch, restart, health gate,
automatic rollback. The caller holds the host's deploy lock.

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from opsctl import __version__, systemd
from opsctl.commands import Cmd, sh
from opsctl.deploy import corridor, release
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.preflight import looks_like_help, unknown_flags
from opsctl.deploy.release import Manifest, ReleaseFacts, ServicePaths
from opsctl.errors import DeployError, OpsctlError, UnreachableError
from opsctl.health import probe
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

    # ------------------------------------------------------------------ deploy
    def deploy(self, force: bool = False, plan: bool = False, keep: int = release.DEFAULT_KEEP) -> RouterResult:
        start = time.monotonic()
        result = RouterResult(self.host.name, self.router.name, Outcome.FAILED)
        facts = self.facts()
        result.previous = facts.current
        chash = self.config_hash()
        new_id = release.unused_release_id(_now(), chash, {r.release_id for r in facts.releases})
        if facts.current is not None and facts.current_hash == chash and not force:
            result.outcome, result.release = Outcome.UNCHANGED, facts.current
            health = probe(self.http, router_url(self.inventory, self.router) + "/health", timeout=5.0)
            result.message = f"release {facts.current}: same config, nothing restarted"
            came_up, note = (False, "") if health.ok or plan else corridor.came_up(self)
            if not (health.ok or plan or came_up) and not self._running():
                # stopped (`systemctl stop`, out of restarts): the release it served is started again, gated
                came_up, note = self._start_again(facts.current)
                if came_up:
                    result.message = f"release {facts.current}: same config"
            if health.ok or plan or came_up:
                result.message += note
            else:
                result.outcome = Outcome.FAILED
                name = self.router.name
                result.message = (
                    f"unchanged config (release {facts.current}) but /health: {health.describe()}{note}; "
                    f"`opsctl logs -i INVENTORY --router {name}` shows why; `opsctl deploy -i INVENTORY --router "
                    f"{name} --force` deploys it as a new release"
                )
            return result
        if plan:
            rendered = render_router(self.inventory, self.router, new_id)
            result.outcome, result.release = Outcome.PLANNED, new_id
            result.message = f"would deploy router release {new_id} (current: {facts.current or 'none'})"
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
            return result
        result.release = new_id
        self.audit("deploy-start", new_id, "started", f"previous={facts.current or '-'}")
        self.say(f"staging router release {new_id}")
        try:
            self._stage(new_id, chash, facts.current)
        except UnreachableError as exc:
            result.outcome, result.message = Outcome.UNREACHABLE, exc.one_line()
            return result
        except OpsctlError as exc:
            result.message = corridor.staging_failed(self, new_id, exc)
            return result
        result.timings["stage_s"] = time.monotonic() - start
        self.say(f"switching to {new_id} and restarting {self.paths.unit_name}")
        try:
            ok, reason, healthy_s = self._gate(self.restart(new_id))
        except OpsctlError as exc:
            ok, reason, healthy_s = False, exc.one_line(), 0.0
        if ok:
            result.timings["healthy_s"] = healthy_s
            doomed = release.plan_prune(self.facts(), keep)
            if doomed:
                self._run(release.remove_releases_cmd(self.paths, doomed), check=False)
            result.outcome = Outcome.DEPLOYED
            result.message = f"{new_id} (previous: {facts.current or 'none'})"
            result.timings["total_s"] = time.monotonic() - start
            self.audit("deploy", new_id, "ok", f"previous={facts.current or '-'}")
            return result
        result.journal_tail = self.journal_tail()
        result.outcome, result.message = corridor.roll_back_after_failure(self, facts.current, new_id, reason)
        result.timings["total_s"] = time.monotonic() - start
        return result

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
        result.outcome, result.message, result.journal_tail = corridor.roll_back_to(self, facts.current, target)
        return result


def _urls(inventory: Inventory, router: Router) -> tuple[str, ...]:
    return worker_urls(inventory, router)


def _now() -> datetime:
    return datetime.now(UTC)
