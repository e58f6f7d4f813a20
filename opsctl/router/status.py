"""`opsctl status` for a router: its unit and release (over SSH), its health, and its members as the router
itself reports them (`GET /workers`): which fronted services it routes to, healthy or not, and which of them
it does not list at all; like a service's row, a release whose gates never finished and files edited on the host
(drift). Reads only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from opsctl.commands import Cmd
from opsctl.deploy import drift, lock, release
from opsctl.errors import OpsctlError
from opsctl.inventory.model import Inventory, Router
from opsctl.remote.base import Connection
from opsctl.router.api import Member, RouterClient
from opsctl.router.keptout import Membership, kept_out_file, live_leases, parse_membership
from opsctl.router.render import router_url, worker_url
from opsctl.systemd import UnitState, parse_show, show_cmd

STATE_DIR = "/var/lib/opsctl/canary"  # the router's last canary (opsctl.rollout.canary writes it)


def state_file(name: str) -> str:
    return f"{STATE_DIR}/{name}.json"


def state_path(router: Router) -> str:
    return state_file(router.name)


def parse_state(text: str) -> dict[str, Any] | None:
    """The canary state file as written; None when absent or not a JSON object."""
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class MemberStatus:
    worker: str  # host/service, or the URL when the router lists a worker the inventory does not name
    url: str
    healthy: bool
    load: int


@dataclass(frozen=True)
class RouterStatus:
    router: str
    host: str
    url: str
    unit: UnitState | None
    current: str | None
    releases: int
    bad_releases: int
    rollback_to: str | None
    health: str
    healthy: bool  # /health 200 and every fronted service listed and healthy
    members: list[MemberStatus] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # fronted services the router does not list
    error: str | None = None
    canary: dict[str, Any] | None = None  # the last canary: phase, groups, comparison table, message
    kept_out: list[str] = field(default_factory=list)  # workers its next start leaves out (opsctl.router.keptout)
    deploys: list[str] = field(default_factory=list)  # workers out for a deploy now: "lab1/ref (by who, since)"
    gates_pending: bool = False  # current went live and its gates never finished (never tested)
    drift: list[str] = field(default_factory=list)  # files of the current release (or the rollback target) changed
    lock: str | None = None  # the host's deploy lock (a router deploys under it): holder, age, STALE
    lock_stale: bool = False  # held by a process that is gone

    @property
    def deploying(self) -> bool:
        """A deploy holds the router host's lock now: a restart and a release whose gates have not finished are
        what it is doing, not an outage or an interrupted deploy (as `ServiceStatus.deploying`)."""
        return self.lock is not None and not self.lock_stale

    @property
    def failing(self) -> bool:
        """Whether this row makes `status` exit non-zero: not healthy, drift, or a release whose gates never
        finished (the first and last only while no deploy runs on the host), as a service row."""
        busy = self.deploying
        return (not self.healthy and not busy) or bool(self.drift) or (self.gates_pending and not busy)


def worker_names(inventory: Inventory, router: Router) -> dict[str, str]:
    """URL -> host/service of the router's workers."""
    names = {}
    for ref in router.workers:
        host = inventory.host(ref.host)
        names[worker_url(host, host.service(ref.service).port)] = str(ref)
    return names


def members_view(
    inventory: Inventory, router: Router, members: tuple[Member, ...]
) -> tuple[list[MemberStatus], list[str]]:
    """Router-reported members named by the inventory, and the fronted services it does not list. Pure."""
    names = worker_names(inventory, router)
    listed = [MemberStatus(names.get(m.url, m.url), m.url, m.healthy, m.load) for m in members]
    seen = {m.url for m in members}
    return listed, [name for url, name in names.items() if url not in seen]


def collect_router(conn: Connection | None, inventory: Inventory, router: Router, http: httpx.Client) -> RouterStatus:
    paths = release.ServicePaths(router.unit_base)
    unit = None
    canary = None
    membership = Membership()
    facts = release.ReleaseFacts(None, ())
    changed: list[str] = []
    held: str | None = None  # the host's deploy lock, as `status` says it
    stale = False
    error = None
    if conn is not None:
        try:
            unit = parse_show(conn.run(show_cmd(paths.unit_name)).stdout)
            facts = release.parse_release_facts(conn.run(release.facts_cmd(paths)).stdout)
            canary = parse_state(conn.run(Cmd.of("cat", "--", state_path(router)), check=False).stdout)
            text = conn.run(Cmd.of("cat", "--", kept_out_file(router.name)), check=False).stdout
            membership = parse_membership(text)
            changed = drift.status_lines(conn, paths, facts)
            held, stale = lock.held_now(conn, datetime.now(UTC))
        except OpsctlError as exc:
            error = exc.one_line()
    client = RouterClient(http, router_url(inventory, router), router.api_key)
    probe = client.health()
    members: list[MemberStatus] = []
    missing = [str(w) for w in router.workers]
    if probe.ok:
        try:
            members, missing = members_view(inventory, router, client.members())
        except OpsctlError as exc:
            error = exc.one_line()
    names = worker_names(inventory, router)
    # a worker out for a deploy that still runs is what a rolling deploy does, not a fault of the router
    leased = {names.get(url, url) for url in live_leases(membership, "")}
    down = [w for w in missing if w not in leased] + [
        m.worker for m in members if not m.healthy and m.worker not in leased
    ]
    healthy = probe.ok and not down and error is None
    now = datetime.now(UTC)
    return RouterStatus(
        router=router.name,
        host=router.host,
        url=client.base,
        unit=unit,
        current=facts.current,
        releases=len(facts.releases),
        bad_releases=sum(1 for r in facts.releases if r.bad),
        rollback_to=facts.rollback_target(),
        health=probe.describe(),
        healthy=healthy,
        members=members,
        missing=missing,
        error=error,
        canary=canary,
        kept_out=[names.get(url, url) for url in sorted(membership.kept_out)],
        deploys=[f"{names.get(url, url)} (by {info.describe(now)})" for url, info in membership.deploys],
        gates_pending=facts.current_pending,
        drift=changed,
        lock=held,
        lock_stale=stale,
    )
