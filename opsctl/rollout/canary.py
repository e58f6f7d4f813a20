"""`opsctl deploy --canary` behind a router with a `canary:` block: the canary workers move to the new release
(the usual drain-aware deploy), the rest stay on the old one; both groups are measured over `window` seconds
of live traffic; then the rest is promoted (the rolling deploy) or the canary rolled back, by itself.

Measuring (this module) is separate from judging (opsctl.rollout.judge, pure). Every decision is audited on
the router's host and locally, and the phase and the comparison are written to the router's host
(`STATE_FILE`), which `opsctl status --router` shows. Ctrl-C at any point leaves the fleet on the old
release: the runner restores a worker caught mid-deploy, and the canary (and any promoted worker) is rolled
back with Ctrl-C ignored until that is done.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import httpx

from opsctl import promtext, remote, smoke, systemd
from opsctl.commands import Cmd, sh
from opsctl.deploy import release
from opsctl.deploy.flow import DeploySettings, ServiceResult
from opsctl.deploy.outcome import Outcome
from opsctl.errors import OpsctlError
from opsctl.health import auth_headers
from opsctl.inventory.model import CanaryConfig, Host, Inventory, Router, Service, WorkerRef
from opsctl.kernel import audit
from opsctl.remote.base import Connect, Connection
from opsctl.remote.held import HeldConnections
from opsctl.rollout import judge, runner
from opsctl.rollout.rolling import RouterGuard
from opsctl.rollout.runner import RolloutOptions, RunReport
from opsctl.router.api import RouterClient
from opsctl.router.render import router_url, worker_url
from opsctl.router.status import STATE_DIR, state_path
from opsctl.wheel import RuntimeWheel

Selection = Sequence[tuple[Host, Sequence[Service]]]
# Tokens per replayed prompt: a divergence of tree verify shows within the first rounds, and the replay runs
# on serving workers, next to their live traffic.
REPLAY_TOKENS = 16


@dataclass
class CanaryReport:
    router: str
    phase: str  # deploying | measuring | promoting | rolling-back | promoted | rolled-back | interrupted | failed
    canary: list[str] = field(default_factory=list)  # host/service
    old: list[str] = field(default_factory=list)
    window_s: float = 0.0
    table: list[str] = field(default_factory=list)
    verdict: str = ""  # promote | roll back | ""
    message: str = ""
    started: str = ""
    updated: str = ""


def fronted_selection(inventory: Inventory, selection: Selection) -> Router | None:
    """The router with a canary block that fronts selected services (None: the plain --canary applies)."""
    picked = {WorkerRef(h.name, s.name) for h, svcs in selection for s in svcs}
    for router in inventory.routers:
        if router.canary is not None and picked & set(router.workers):
            return router
    return None


def split(router: Router, selection: Selection) -> tuple[list[WorkerRef], list[WorkerRef], list[WorkerRef]]:
    """(canary, old group, promoted later): the first `workers` selected services the router fronts, the
    router's other workers, and every other selected service."""
    config = router.canary or CanaryConfig()
    selected = [WorkerRef(h.name, s.name) for h, svcs in selection for s in svcs]
    fronted = [w for w in router.workers if w in selected]
    canary = fronted[: config.workers]
    return canary, [w for w in router.workers if w not in canary], [w for w in selected if w not in canary]


def _subset(selection: Selection, refs: Sequence[WorkerRef]) -> list[tuple[Host, list[Service]]]:
    wanted = set(refs)
    out = [(h, [s for s in svcs if WorkerRef(h.name, s.name) in wanted]) for h, svcs in selection]
    return [(h, svcs) for h, svcs in out if svcs]


def plan_lines(router: Router, selection: Selection) -> list[str]:
    config = router.canary or CanaryConfig()
    canary, old, rest = split(router, selection)
    return [
        f"canary behind router {router.name}: {', '.join(map(str, canary))} first (drain-aware deploy); "
        f"{', '.join(map(str, old))} stay on the old release",
        f"compare for {config.window:g}s of live traffic (a look every {tick_s(config.window):g}s; a self-check "
        f"failure, a restart, refused requests (the router's counts) or differing tokens roll back at once; on "
        f"up to {config.max_window:g}s while traffic is short): >= {config.min_requests} requests each, error "
        f"rate (aborted + refused) <= "
        f"old + {config.max_error_rate:.2%}, TTFT/ITL p95 <= {config.max_ttft_ratio:g}x/{config.max_itl_ratio:g}x, "
        f"tok/s >= {config.min_tok_s_ratio:g}x, tau >= {config.min_tau_ratio:g}x, self-check failures <= "
        f"{config.max_selfcheck_failures}, restarts <= {config.max_restarts}"
        + (f", {config.replay} greedy requests replayed on a mode change" if config.replay else ""),
        f"then promote {', '.join(map(str, rest)) or '(nothing else selected)'} (rolling) or roll the canary back",
    ]


class Canary:
    """One canary run behind `router`."""

    def __init__(
        self,
        inventory: Inventory,
        router: Router,
        selection: Selection,
        say: Callable[[str], None],
        connect: Connect = remote.connect,
        guard: RouterGuard | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        assert router.canary is not None  # fronted_selection picked it for its block
        self.inventory = inventory
        self.router = router
        self.config: CanaryConfig = router.canary
        self.selection = selection
        self.say = say
        self.connect = connect
        self.guard = guard or RouterGuard(inventory)
        self.clock = clock
        self.sleep = sleep
        self.http = httpx.Client()
        canary, old, rest = split(router, selection)
        self.canary, self.old, self.rest = canary, old, rest
        self.report = CanaryReport(router.name, "deploying", [str(w) for w in canary], [str(w) for w in old])
        self.report.started = _now()
        self._conns = HeldConnections(inventory, connect)

    # ------------------------------------------------------------------ plumbing
    def _conn(self, host: str) -> Connection:
        return self._conns.get(host)

    def close(self) -> None:
        self._conns.close()
        self.http.close()

    def _audit(self, action: str, result: str, detail: str) -> None:
        """In the router's inventory's own log, as the same run's deploy lines are."""
        try:
            conn: Connection | None = self._conn(self.router.host)
        except OpsctlError:
            conn = None
        host = self.inventory.host(self.router.host)
        audit.record(host, self.router.unit_base, action, None, result, detail, conn=conn)

    def _save(self, phase: str, message: str = "") -> None:
        """The phase (and comparison) on the router's host, for `opsctl status`; best effort."""
        self.report.phase, self.report.updated = phase, _now()
        if message:
            self.report.message = message
        try:
            conn = self._conn(self.router.host)
            conn.run(Cmd.of("mkdir", "-p", "--", STATE_DIR, sudo=True), check=False, timeout=30)
            conn.put_text(json.dumps(asdict(self.report), indent=1) + "\n", state_path(self.router), 0o644)
        except OpsctlError:
            pass

    def _url(self, ref: WorkerRef) -> str:
        host = self.inventory.host(ref.host)
        return worker_url(host, host.service(ref.service).port)

    def _service(self, ref: WorkerRef) -> Service:
        return self.inventory.host(ref.host).service(ref.service)

    # ------------------------------------------------------------------ measuring
    def _scrape(self, ref: WorkerRef) -> promtext.Scrape:
        try:
            headers = auth_headers(self._service(ref).api_key)
            response = self.http.get(self._url(ref) + "/metrics", headers=headers, timeout=10.0)
        except httpx.HTTPError as exc:
            return promtext.Scrape({}, error=type(exc).__name__)
        if response.status_code != 200:
            return promtext.Scrape({}, error=f"HTTP {response.status_code}")
        return promtext.parse(response.text)

    def _router_scrape(self) -> promtext.Scrape:
        """The router's own counters (its Prometheus listener, no key): what each worker answered clients."""
        host = self.inventory.host(self.router.host)
        try:
            response = self.http.get(worker_url(host, self.router.prometheus_port) + "/metrics", timeout=10.0)
        except httpx.HTTPError as exc:
            return promtext.Scrape({}, error=type(exc).__name__)
        if response.status_code != 200:
            return promtext.Scrape({}, error=f"HTTP {response.status_code}")
        return promtext.parse(response.text)

    def _restarts(self, ref: WorkerRef) -> int:
        unit = self._service(ref).unit_name
        try:
            return systemd.parse_show(self._conn(ref.host).run(systemd.show_cmd(unit), timeout=60).stdout).n_restarts
        except OpsctlError:
            return 0

    def _journal(self, ref: WorkerRef, since_epoch: int) -> tuple[str, ...]:
        unit = self._service(ref).unit_name
        cmd = sh(
            f"journalctl -u {unit} --no-pager -o cat --since @{since_epoch} "
            f"| grep -E 'DDTREE (metrics |self-check FAILED)' | tail -n 2000 || true",
            sudo=True,
        )
        try:
            return tuple(self._conn(ref.host).run(cmd, check=False, timeout=60).stdout.splitlines())
        except OpsctlError:
            return ()

    def _windows(
        self, refs: Sequence[WorkerRef], start: dict[WorkerRef, promtext.Scrape], restarts: dict[WorkerRef, int],
        since: int, router_start: promtext.Scrape,
    ) -> dict[WorkerRef, judge.WorkerWindow]:  # fmt: skip
        # The router first, then the workers (at the start the other way round): a request in between is then
        # counted by a worker and not by the router, never sent and unanswered
        router_end = self._router_scrape()
        return {
            r: judge.WorkerWindow(
                self._url(r),
                start[r],
                self._scrape(r),
                self._journal(r, since),
                restarts[r],
                self._restarts(r),
                router_start,
                router_end,
            )
            for r in refs
        }

    def measure(self, replay: judge.Replay | None = None) -> judge.Verdict:
        """Both groups sampled at `next_look` times, each look judged on everything since the start,
        until the verdict is not `continue` (interruptible by KeyboardInterrupt)."""
        refs = [*self.canary, *self.old]
        since = int(time.time())
        restarts = {r: self._restarts(r) for r in refs}
        start = {r: self._scrape(r) for r in refs}
        router_start = self._router_scrape()
        t0 = self.clock()
        # Different tokens are known already: one look now, for the table, and the canary goes at once
        due = -1.0 if replay is not None and replay.equal < replay.sent else 0.0
        while True:
            due = next_look(due, self.config)
            while self.clock() - t0 < due:
                self.sleep(min(1.0, max(0.0, due - (self.clock() - t0))))
            windows = self._windows(refs, start, restarts, since, router_start)
            elapsed = self.clock() - t0
            verdict = judge.judge(
                judge.group_stats([windows[r] for r in self.canary]),
                judge.group_stats([windows[r] for r in self.old]),
                self.config, replay, elapsed,
            )  # fmt: skip
            self.report.window_s = round(elapsed, 1)
            self.report.table = judge.table(verdict)
            if verdict.decision is not judge.Decision.CONTINUE:
                return verdict
            self._save("measuring", verdict.reason)
            self.say(f"canary: {elapsed:.0f}s: {_summary(verdict)}")

    def _mode_changed(self, results: Sequence[ServiceResult]) -> bool:
        """A canary whose release runs another mode than the release it replaced (read from both manifests)."""
        for r in results:
            if r.previous is None or r.release is None:
                continue
            paths = release.ServicePaths(r.service)
            try:
                conn = self._conn(r.host)
                new = json.loads(conn.get_text(f"{paths.release(r.release)}/{release.MANIFEST}")).get("mode")
                old = json.loads(conn.get_text(f"{paths.release(r.previous)}/{release.MANIFEST}")).get("mode")
            except (OpsctlError, ValueError):
                return True  # unknown: replaying costs a few requests, missing a changed mode costs more
            if new != old:
                return True
        return False

    def replay(self) -> judge.Replay:
        """The first `replay` prompts of the shipped greedy set on a canary and an old worker."""
        prompts = [replace(p, max_tokens=min(p.max_tokens, REPLAY_TOKENS)) for p in smoke.load_prompts()]
        prompts = prompts[: self.config.replay]
        mine, theirs = self.canary[0], self.old[0]
        try:
            report = smoke.run_equivalence(
                self.http,
                (str(mine), self._url(mine), auth_headers(self._service(mine).api_key)),
                (str(theirs), self._url(theirs), auth_headers(self._service(theirs).api_key)),
                prompts,
            )
        except OpsctlError as exc:
            return judge.Replay(len(prompts), 0, exc.one_line())
        differ = next((p for p in report.prompts if not p.equal), None)
        where = f"prompt {differ.id} differs at {differ.unit[:-1]} {differ.first_divergence}" if differ else ""
        return judge.Replay(len(report.prompts), sum(1 for p in report.prompts if p.equal), where)

    # ------------------------------------------------------------------ the run
    def run(
        self, wheel: RuntimeWheel, settings: DeploySettings, options: RolloutOptions
    ) -> tuple[RunReport, CanaryReport]:
        report = RunReport("deploy")
        members = RouterClient(self.http, router_url(self.inventory, self.router), self.router.api_key).members()
        canary_urls, why = judge.pick_canary(
            members, [self._url(w) for w in self.router.workers if w in {*self.canary, *self.rest}],
            self.config.workers,
        )  # fmt: skip
        if not canary_urls:
            self._audit("canary", "refused", why)
            self.report.phase, self.report.message = "failed", f"no canary started: {why}"
            return report, self.report
        names = ", ".join(self.report.canary)
        self._audit("canary-start", "started", f"canary={names} old={','.join(self.report.old)}")
        self._save("deploying", f"deploying {names}")
        self.say(f"canary: deploying {names} behind router {self.router.name}; the rest stay on the old release")
        plain = RolloutOptions(lock_wait=options.lock_wait, forks=options.forks)
        first = runner.deploy(_subset(self.selection, self.canary), wheel, settings, plain, self.say,
                              self.connect, self.guard)  # fmt: skip
        report.results += first.results
        if first.interrupted:
            report.interrupted = True
            return report, self._finish("interrupted", "interrupted while deploying the canary: old release serves")
        if any(r.outcome is not Outcome.DEPLOYED for r in first.results):
            if all(r.outcome is Outcome.UNCHANGED for r in first.results):
                self.say("canary: unchanged (same release): nothing to compare, deploying the rest")
                return self._promote(report, wheel, settings, options, "canary unchanged")
            bad = next(r for r in first.results if r.outcome is not Outcome.DEPLOYED)
            return report, self._finish("rolled-back", f"canary {bad.host}/{bad.service} {bad.outcome}: {bad.message}")
        deployed = [r for r in first.results if r.outcome is Outcome.DEPLOYED]
        try:
            replay = None
            if self.config.replay and self._mode_changed(deployed):
                self.say(f"canary: mode changed: replaying {self.config.replay} greedy request(s) on both groups")
                replay = self.replay()
            self._save("measuring", f"comparing for {self.config.window:g}s")
            self.say(f"canary: comparing {names} with {', '.join(self.report.old)} for {self.config.window:g}s")
            verdict = self.measure(replay)
        except KeyboardInterrupt:
            report.interrupted = True
            self._roll_back(report, deployed, "interrupted while measuring")
            return report, self._finish("interrupted", "interrupted: canary rolled back, the old release serves")
        self.report.verdict = verdict.decision.value
        for line in self.report.table:
            self.say(f"canary: {line}")
        self._audit("canary-verdict", self.report.verdict.replace(" ", "-"), verdict.reason)
        if not verdict.promote:
            self._save("rolling-back", verdict.reason)
            self._roll_back(report, deployed, verdict.reason)
            return report, self._finish("rolled-back", f"canary rolled back: {verdict.reason}")
        return self._promote(report, wheel, settings, options, verdict.reason, deployed)

    def _promote(
        self,
        report: RunReport,
        wheel: RuntimeWheel,
        settings: DeploySettings,
        options: RolloutOptions,
        why: str,
        canary: Sequence[ServiceResult] = (),
    ) -> tuple[RunReport, CanaryReport]:
        rest = _subset(self.selection, self.rest)
        self._save("promoting", why)
        if not rest:
            return report, self._finish("promoted", f"promoted ({why}); nothing else selected")
        self.say(f"canary: promoting {', '.join(map(str, self.rest))} (rolling, drain-aware)")
        batches = RolloutOptions(batch=options.batch, max_fail=options.max_fail, lock_wait=options.lock_wait,
                                 forks=options.forks)  # fmt: skip
        second = runner.deploy(rest, wheel, settings, batches, self.say, self.connect, self.guard)
        report.results += second.results
        report.stopped_early = second.stopped_early
        if second.interrupted:
            report.interrupted = True
            done = [*canary, *(r for r in second.results if r.outcome is Outcome.DEPLOYED)]
            self._roll_back(report, done, "interrupted while promoting")
            return report, self._finish("interrupted", "interrupted: canary and promoted workers rolled back")
        failed = [r for r in second.results if r.outcome.failed]
        if failed:
            return report, self._finish("failed", f"promotion: {len(failed)} worker(s) failed ({failed[0].message})")
        return report, self._finish("promoted", f"promoted ({why})")

    def _roll_back(self, report: RunReport, deployed: Sequence[ServiceResult], why: str) -> None:
        """Each deployed worker back to the release it replaced, drain-aware, Ctrl-C ignored meanwhile."""
        if not deployed:
            return
        self.say(f"canary: rolling back {', '.join(f'{r.host}/{r.service}' for r in deployed)} ({why})")
        with _sigint_ignored():
            for r in deployed:
                if r.release is not None:
                    try:
                        self._conn(r.host).run(
                            release.mark_bad_cmd(release.ServicePaths(r.service), r.release, f"canary: {why}"),
                            check=False, timeout=60,
                        )  # fmt: skip
                    except OpsctlError:
                        pass
                refs = [WorkerRef(r.host, r.service)]
                back = runner.rollback(
                    _subset(self.selection, refs), DeploySettings(), RolloutOptions(), self.say, r.previous,
                    self.connect, self.guard,
                )  # fmt: skip
                for result in back.results:
                    report.results = [x for x in report.results if (x.host, x.service) != (r.host, r.service)]
                    result.message = f"canary rolled back ({why}): {result.message}"
                    if result.outcome is Outcome.REVERTED:
                        result.outcome = Outcome.ROLLED_BACK
                    report.results.append(result)

    def _finish(self, phase: str, message: str) -> CanaryReport:
        if self.report.table and self.report.table[-1].startswith(f"verdict: {judge.Decision.CONTINUE.value.upper()}"):
            self.report.table[-1] = f"verdict: NONE ({phase}: {message})"  # the last look's, stale from now on
        self._save(phase, message)
        self._audit("canary", phase, message)
        self.say(f"canary: {message}")
        return self.report


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    try:
        previous: Any = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to ignore there
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def tick_s(window: float) -> float:
    """Seconds between two looks at both groups: ten looks a window, 5 s to 30 s apart."""
    return min(30.0, max(5.0, window / 10))


def next_look(last: float, config: CanaryConfig) -> float:
    """When (seconds into the window) to look after the look at `last`: every tick, and exactly at `window` and
    at `max_window`, the last one."""
    tick = tick_s(config.window)
    candidates = [(math.floor(last / tick + 1e-9) + 1) * tick, config.max_window]
    if config.window > last:
        candidates.append(config.window)
    return min(candidates)


def _summary(verdict: judge.Verdict) -> str:
    """One line of the numbers so far (the full table is printed with the verdict)."""
    shown = ("requests", "error rate", "ITL p95", "tok/s")
    cells = [f"{r.metric} {r.canary} vs {r.old}" for r in verdict.rows if r.metric in shown]
    return f"{verdict.reason}; " + ", ".join(cells)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
