"""Drain-aware rolling deploys behind sglang-router: take a worker out, drain it, deploy, put it back.

For a service that a router fronts, the deploy (opsctl.deploy.flow) calls `take_out` right before it switches
the release, and the runner calls `put_back` when the deploy is over:

1. wait for a free slot of the router (`max_unavailable`, default 1: one worker out per router at a time), in this
   process and across every opsctl that deploys behind the router (below);
2. refuse when no other worker of the router is healthy (never take the last healthy worker out), or wait while
   the others are out for another deploy;
3. record the take-out on the router's host, then `DELETE /workers/<id>`, wait until the router no longer lists it;
4. drain: poll the worker's `/get_load` until nothing is in flight (bounded by `drain_timeout`, wait shown);
5. (the deploy: switch, restart, health gate, smoke gate; on failure the previous release is restored)
6. put back when the worker serves a release that passed its gates (the new one, or the old one restored):
   `POST /workers`, wait until the router reports it healthy, then free the slot for the next worker.
   A worker that is not healthy stays out, and the result says so.

A router that does not answer at all (not deployed yet, or down) serves nobody: the deploy goes on without it,
and says so; the worker is still kept out of it (below): systemd may bring it back mid-deploy.

Steps 1-3 and 6 are serialized per router across processes and machines by the router's membership file on its
host (opsctl.router.keptout): the take-out is a compare-and-swap that records the deploy's lease (who, since when)
and the decision made on what was read; the lease goes only once the worker is back and healthy (or left out). Two
operators deploying different workers behind one router: the second waits (`waiting for router R: ...`, at most
`ROUTER_WAIT_S`) instead of being refused or emptying the router. A router host that cannot be read refuses the
take-out (nothing switched): without the file no deploy can tell whether another holds a worker out.

A worker taken out stays out until step 6: that is desired state, recorded here, not only the router's. A router
that restarts meanwhile (systemd's Restart=, a crash, a kill) comes back with every worker of its
`--worker-urls`, the one being deployed included, whose gates have not passed. So opsctl records the workers it
keeps out on the router's host before each take-out and put-back (opsctl.router.keptout), and the router's
launcher starts without them. A watcher also compares the router's members with what opsctl took out every
`watch_interval` seconds and takes such a worker out again, saying so (a router whose host could not be written,
or one someone adds the worker to).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from opsctl.deploy.lock import new_lock_info
from opsctl.errors import DeployError, OpsctlError
from opsctl.health import auth_headers, probe
from opsctl.inventory.model import Inventory, Router
from opsctl.router import keptout
from opsctl.router.api import Member, RouterClient, worker_load
from opsctl.router.keptout import Membership, MembershipStore, Verdict
from opsctl.router.render import router_url, worker_url
from opsctl.router.status import worker_names

MEMBERSHIP_TIMEOUT_S = 60.0  # the router applies add/remove in the background; this is how long we wait
WATCH_INTERVAL_S = 1.0  # how often the members of a router with a worker out are compared with what opsctl wants
DRAIN_POLL_S = 0.25
NO_LOAD_GRACE_S = 3.0  # a worker without /get_load: wait this long for its in-flight requests instead
# How long a take-out waits for another opsctl's deploy behind the same router: longer than one worker's deploy
# from its take-out to its put-back (drain, restart, a 27B model's load within health_timeout, smoke gate).
ROUTER_WAIT_S = 1800.0
ROUTER_POLL_S = 2.0  # how often a waiting take-out reads the membership file and /workers again
WAIT_SAY_S = 30.0  # a waiting take-out says so again this often


@dataclass
class _RouterSlot:
    router: Router
    slots: threading.BoundedSemaphore


@dataclass(frozen=True)
class _KeptOut:
    """A worker opsctl keeps out of a router (its deploy's gates have not passed, or it serves nothing)."""

    router: Router
    url: str
    name: str  # host/service
    say: Callable[[str], None]


@dataclass(frozen=True)
class Taken:
    """A worker taken out of one router; `put_back` owes the router its slot and the lease it recorded."""

    router: Router
    url: str
    was_member: bool
    router_down: bool = False  # the router did not answer at the take-out: no slot held, only kept out
    token: str = ""  # the lease recorded in the router's membership file ("": none)


class RouterGuard:
    """Shared by every deploy of one run: the routers of the inventory and their free slots."""

    def __init__(
        self,
        inventory: Inventory,
        client: Callable[[Router], RouterClient] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        http: httpx.Client | None = None,
        watch_interval: float | None = WATCH_INTERVAL_S,
        kept_out: MembershipStore | None = None,
        wait_s: float = ROUTER_WAIT_S,
    ) -> None:
        self.inventory = inventory
        # where each router's membership is recorded: its host (the CLI), or this process alone (unit tests)
        self.kept_out: MembershipStore = kept_out or keptout.MemoryMembership()
        self.wait_s = wait_s
        self.watch_interval = watch_interval  # None: no watcher (callers reconcile themselves)
        self._kept_out: dict[tuple[str, str], _KeptOut] = {}  # (router, url) -> the worker kept out
        self._kept_lock = threading.Lock()  # held while reconciling, and to stop keeping a worker out
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.http = http or httpx.Client()
        self._client = client or (lambda r: RouterClient(self.http, router_url(inventory, r), r.api_key))
        self.sleep = sleep
        self.clock = clock
        self._slots = {r.name: _RouterSlot(r, threading.BoundedSemaphore(r.max_unavailable)) for r in inventory.routers}

    def fronted(self, host: str, service: str) -> bool:
        return bool(self.inventory.routers_of(host, service))

    def take_out(
        self, host: str, service: str, say: Callable[[str], None], cancelled: Callable[[], bool] = lambda: False
    ) -> list[Taken]:
        """Out of every router that fronts host/service, drained. On an error every router already left is
        given its worker and slot back, and a DeployError says why (nothing was switched yet)."""
        taken: list[Taken] = []
        try:
            for router in self.inventory.routers_of(host, service):
                item = self._take_out_of(router, host, service, say, cancelled)
                if item is not None:
                    taken.append(item)
            held = [t for t in taken if not t.router_down]
            if held:
                self._drain(host, service, held, say)
        except BaseException:
            self.put_back(taken, True, say)
            raise
        return taken

    def _take_out_of(
        self, router: Router, host: str, service: str, say: Callable[[str], None], cancelled: Callable[[], bool]
    ) -> Taken | None:
        slot = self._slots[router.name]
        url = self._url(host, service)
        t0 = self.clock()
        announced = False
        while not slot.slots.acquire(timeout=0.5):
            if cancelled():
                raise DeployError(f"interrupted while waiting for router {router.name}", "nothing was switched")
            if not announced:
                say(f"waiting for router {router.name}: {router.max_unavailable} worker(s) already out")
                announced = True
        if announced:
            say(f"router {router.name}: slot free after {self.clock() - t0:.1f}s")
        try:
            client = self._client(router)
            if not client.health().ok:
                say(
                    f"router {router.name} does not answer /health: deploying without it (it serves nobody now; "
                    "kept out of it should it restart meanwhile)"
                )
                slot.slots.release()
                self._record(router, url, True, say)
                self._keep_out(_KeptOut(router, url, f"{host}/{service}", say))
                return Taken(router, url, False, router_down=True)
            name = f"{host}/{service}"
            me, token, serving = self._claim(router, client, url, name, say, cancelled)
            try:
                if me is not None:
                    client.remove(me)
                    self._wait(lambda: client.member(url) is None, f"router {router.name} to drop {url}")
            except BaseException:
                self._release(router, url, token, False, say)  # nothing switched: neither kept out nor leased
                raise
            say(
                f"out of router {router.name} ({serving} other healthy worker(s) serve)"
                if me is not None
                else f"not a member of router {router.name}: it is added after the deploy"
            )
            self._keep_out(_KeptOut(router, url, name, say))
            return Taken(router, url, me is not None, token=token)
        except BaseException:
            slot.slots.release()
            raise

    def _claim(
        self,
        router: Router,
        client: RouterClient,
        url: str,
        name: str,
        say: Callable[[str], None],
        cancelled: Callable[[], bool],
    ) -> tuple[Member | None, str, int]:
        """Record on the router's host that this deploy takes `url` out (its lease, and the URL kept out of the
        router's next start), once the router's other workers can serve without it: waits while another deploy
        holds workers out, refuses when `url` is the last healthy worker. (its member entry or None, the lease's
        token, how many other healthy workers serve). The membership file is read before /workers, and written
        only if unchanged since (keptout)."""
        lease = new_lock_info(f"deploy {name}")
        names = worker_names(self.inventory, router)
        t0 = self.clock()
        said_at: float | None = None
        lost = 0  # swaps lost in a row: another opsctl changed the file between this one's read and write
        while True:
            version, state = self._read(router)
            members = client.members()
            with self._kept_lock:  # a worker this process keeps out that a restarted router lists again
                kept = {u for (r, u) in self._kept_out if r == router.name and u != url}
            decision = keptout.decide_take_out(state, members, url, lease, router.max_unavailable, kept, names)
            if decision.verdict is Verdict.TAKE and decision.after is not None:
                if not self._swap(router, version, decision.after):
                    lost += 1  # another opsctl changed it since it was read: decide again on what is there now
                    if lost >= keptout.SWAP_ATTEMPTS:
                        raise DeployError(
                            f"router {router.name}: its membership file on {router.host} changed under each of "
                            f"{lost} attempts to take {name} out",
                            f"nothing was switched; `opsctl status -i INVENTORY --router {router.name}` shows who "
                            "holds it",
                        )
                    continue
                if said_at is not None:
                    say(f"router {router.name}: free after {self.clock() - t0:.1f}s")
                out = decision.after.kept_out | {u for u, _ in decision.after.deploys} | kept
                serving = [m for m in members if m.url != url and m.healthy and m.url not in out]
                return next((m for m in members if m.url == url), None), lease.token, len(serving)
            if decision.verdict is Verdict.REFUSE:
                raise DeployError(
                    f"router {router.name}: {name} is its last healthy worker ({decision.reason}); taking it out would "
                    "stop the router serving",
                    "bring another worker of the router back to health first; nothing was switched",
                )
            waited = self.clock() - t0
            if cancelled():
                raise DeployError(f"interrupted while waiting for router {router.name}", "nothing was switched")
            if waited >= self.wait_s:
                h, _, s = (decision.held_by[0] if decision.held_by else "H/S").partition("/")
                raise DeployError(
                    f"router {router.name}: waited {waited:.0f}s to take {name} out: {decision.reason}",
                    "nothing was switched; deploy again once that deploy ended (if its opsctl was killed, "
                    f"`opsctl deploy -i INVENTORY --host {h} --service {s}` frees its worker's place)",
                )
            if said_at is None or self.clock() - said_at >= WAIT_SAY_S:
                say(
                    f"waiting for router {router.name} ({waited:.0f}s of at most {self.wait_s:.0f}s): {decision.reason}"
                )
                said_at = self.clock()
            self.sleep(ROUTER_POLL_S)

    def _drain(self, host: str, service: str, taken: list[Taken], say: Callable[[str], None]) -> None:
        svc = self.inventory.host(host).service(service)
        url = taken[0].url
        headers = auth_headers(svc.api_key)
        limit = min(t.router.drain_timeout for t in taken)
        t0 = self.clock()
        load = worker_load(self.http, url, headers)
        if load is None:
            grace = min(limit, NO_LOAD_GRACE_S)
            self.sleep(grace)
            say(f"drain: {url} does not report its load (/get_load); waited {grace:.1f}s")
            return
        while load and self.clock() - t0 < limit:
            self.sleep(DRAIN_POLL_S)
            load = worker_load(self.http, url, headers) or 0
        waited = self.clock() - t0
        if load:
            say(f"drain: {load} request(s) still in flight after {waited:.1f}s (drain_timeout): going on")
        else:
            say(f"drained in {waited:.1f}s (nothing in flight)")

    def put_back(self, taken: list[Taken], serving: bool, say: Callable[[str], None]) -> str:
        """Back into each router (when `serving`: the worker passed its gates), waiting until each reports it
        healthy. Returns "" or one line saying which routers it is not back in."""
        problems: list[str] = []
        for item in taken:
            if item.router_down:
                problem = self._back_after_down(item, serving, say)
                problems += [problem] if problem else []
                continue
            slot = self._slots[item.router.name]
            try:
                if not serving:  # stays out, and stays watched: a restarted router must not take it back
                    problems.append(f"left out of router {item.router.name} (not serving a healthy release)")
                    continue
                with self._kept_lock:
                    self._kept_out.pop((item.router.name, item.url), None)
                problem = self._add(item, say)
                if problem:
                    problems.append(problem)
            finally:
                # the lease goes last: until the worker is healthy in the router, other deploys wait for it
                self._release(item.router, item.url, item.token, not serving, say)
                slot.slots.release()
        return "; ".join(problems)

    def _back_after_down(self, item: Taken, serving: bool, say: Callable[[str], None]) -> str:
        """A worker kept out of a router that did not answer at its take-out: added when the router answers now
        (it restarted meanwhile), else left to the router's own --worker-urls when it starts."""
        if not serving:
            return f"left out of router {item.router.name} (not serving a healthy release)"
        with self._kept_lock:
            self._kept_out.pop((item.router.name, item.url), None)
        if not self._client(item.router).health().ok:
            self._record(item.router, item.url, False, say)  # its next start takes the worker from --worker-urls
            return ""
        return self._add(item, say)

    def ensure_in(self, host: str, service: str, say: Callable[[str], None]) -> str:
        """A serving worker that a router does not list (left out earlier) is added back; "" or the problem. A lease
        on it that an earlier deploy left (its opsctl was killed) goes: the caller holds the host's deploy lock, so no
        other deploy of this worker runs, and other deploys behind the router wait for that lease."""
        url = self._url(host, service)
        kept: dict[str, bool] = {}  # router -> whether its file keeps this worker out
        for router in self.inventory.routers_of(host, service):
            try:
                now = self.kept_out.read(router)[1]
                kept[router.name] = url in now.kept_out
                if now.lease(url) is None:
                    continue
                keptout.change(self.kept_out, router, lambda m: m.leasing(url, None))
            except OpsctlError as exc:
                say(f"router {router.name}: an earlier deploy's lease on this worker stays: {exc.one_line()}")
                continue
            say(f"router {router.name}: freed the place an earlier deploy of this worker held (it did not end)")
        if not self.serving(host, service):
            return ""
        problems = []
        for router in self.inventory.routers_of(host, service):
            try:
                client = self._client(router)
                if not client.health().ok:
                    continue
                if client.member(url) is not None:
                    if kept.get(router.name):  # serving and listed: its next start must not leave it out
                        self._record(router, url, False, say)
                    continue
            except OpsctlError as exc:  # a RouterError: reported, never fatal for an unchanged service
                problems.append(f"router {router.name}: {exc.message}")
                continue
            say(f"not in router {router.name}: adding it")
            problem = self._add(Taken(router, url, False), say)
            if problem:
                problems.append(problem)
        return "; ".join(problems)

    def plan_line(self, host: str, service: str) -> str:
        names = ", ".join(r.name for r in self.inventory.routers_of(host, service))
        limit = min(r.drain_timeout for r in self.inventory.routers_of(host, service))
        return (
            f"before the switch: out of router {names}, drained (at most {limit:g}s); "
            "back in once healthy and smoke-tested"
        )

    def _add(self, item: Taken, say: Callable[[str], None]) -> str:
        self._record(item.router, item.url, False, say)  # first: a restart from here starts with it
        try:
            client = self._client(item.router)
            t0 = self.clock()
            if client.member(item.url) is None:
                client.add(item.url)

            def healthy() -> bool:
                member = client.member(item.url)
                return member is not None and member.healthy

            self._wait(healthy, f"router {item.router.name} to report {item.url} healthy")
        except DeployError as exc:
            return f"not back in router {item.router.name}: {exc.message}"
        except OpsctlError as exc:  # a RouterError (router/api.py turns every httpx error into one)
            return f"not back in router {item.router.name}: {exc.message}"
        say(f"back in router {item.router.name}, healthy after {self.clock() - t0:.1f}s")
        return ""

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        t0 = self.clock()
        while not done():
            if self.clock() - t0 > MEMBERSHIP_TIMEOUT_S:
                raise DeployError(f"timed out after {MEMBERSHIP_TIMEOUT_S:.0f}s waiting for {what}")
            self.sleep(0.25)

    def _url(self, host: str, service: str) -> str:
        inv_host = self.inventory.host(host)
        return worker_url(inv_host, inv_host.service(service).port)

    def serving(self, host: str, service: str) -> bool:
        """The worker answers /health now (decides whether it goes back into its routers)."""
        return probe(self.http, self._url(host, service) + "/health", timeout=5.0).ok

    # ------------------------------------------------------------------ desired membership
    def _record(self, router: Router, url: str, out: bool, say: Callable[[str], None]) -> bool:
        """The router's kept-out file on its host, so that a router restarting starts with the members opsctl
        wants (opsctl.router.keptout); False when it could not be written, said in one line."""
        try:
            keptout.change(self.kept_out, router, lambda m: m.keeping(url, out))
        except OpsctlError as exc:
            say(
                f"router {router.name}: could not record on {router.host} which workers it starts without "
                f"({exc.one_line()}); should it restart now, it takes {url} back until opsctl takes it out again"
            )
            return False
        return True

    def _release(self, router: Router, url: str, token: str, out: bool, say: Callable[[str], None]) -> None:
        """The deploy's lease on `url` goes (only its own: `token`); `out`: whether the router's next start keeps
        it out. Said in one line when the host cannot be written (other deploys behind the router then wait)."""

        def edit(m: Membership) -> Membership:
            lease = m.lease(url)
            return m.keeping(url, out).leasing(url, None if lease is None or lease.token == token else lease)

        try:
            keptout.change(self.kept_out, router, edit)
        except OpsctlError as exc:
            say(
                f"router {router.name}: could not record on {router.host} that this deploy is over "
                f"({exc.one_line()}); other deploys behind it wait until a deploy of this worker frees its place"
            )

    def _read(self, router: Router) -> tuple[str, Membership]:
        try:
            return self.kept_out.read(router)
        except OpsctlError as exc:
            raise _unrecorded(router, exc) from None

    def _swap(self, router: Router, version: str, after: Membership) -> bool:
        try:
            return self.kept_out.swap(router, version, after)
        except OpsctlError as exc:
            raise _unrecorded(router, exc) from None

    def _keep_out(self, item: _KeptOut) -> None:
        with self._kept_lock:
            self._kept_out[(item.router.name, item.url)] = item
            if self.watch_interval is not None and self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="router-membership", daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        assert self.watch_interval is not None
        while not self._stop.wait(self.watch_interval):
            self.reconcile()

    def reconcile(self) -> list[str]:
        """Take out again every worker opsctl keeps out that a router lists (it restarted, or someone added
        it); returns what it did, one line each (each also said to that worker's deploy)."""
        done: list[str] = []
        with self._kept_lock:
            by_router: dict[str, list[_KeptOut]] = {}
            for item in self._kept_out.values():
                by_router.setdefault(item.router.name, []).append(item)
            for items in by_router.values():
                router = items[0].router
                try:
                    client = self._client(router)
                    members = {m.url: m for m in client.members()}
                    for item in items:
                        member = members.get(item.url)
                        if member is None:
                            continue
                        client.remove(member)
                        line = (
                            f"router {router.name} lists {item.name} again (it restarted, or someone added it): "
                            "taken out again until its gates pass"
                        )
                        item.say(line)
                        done.append(line)
                except OpsctlError:
                    continue  # a router that does not answer now routes to nobody; the next look tries again
        return done

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=15.0)
        self.http.close()
        self.kept_out.close()


def _unrecorded(router: Router, exc: OpsctlError) -> DeployError:
    return DeployError(
        f"router {router.name}: cannot read or write its membership on {router.host} ({exc.one_line()}), so whether "
        "another deploy holds a worker out is unknown",
        f"nothing was switched; check that {router.host} answers (`opsctl status -i INVENTORY --router "
        f"{router.name}`), then deploy again",
    )
