"""A router's membership as opsctl wants it, recorded on the router's host: the workers its next start leaves out,
and the deploys that hold a worker out of it now. One file per router, changed only by compare-and-swap.

sglang-router takes its members from `--worker-urls` when it starts. While a worker's deploy runs its gates, opsctl
takes it out over the router's API; a router that restarts meanwhile (systemd's Restart=, a crash, a kill) would
start with every worker of its flags, the ungated one included, and route to it until opsctl's membership watcher
took it out again (0.3-0.5 s measured). The router's launcher (opsctl.router.render.LAUNCHER) leaves out the URLs
listed under `kept_out`, so a restarted router starts with the members opsctl wants.

The same file serializes membership changes across opsctl processes and machines: two operators deploying
different workers behind one router each read it, decide (`decide_take_out`: never the last healthy worker, at
most `max_unavailable` out for a deploy, wait while another deploy holds a worker out), and write it back only if
nobody changed it since they read it (`KeptOutRecorder.swap`: sha256 of what was read, compared under `flock` on
the router's host, in one command). A deploy records its lease (`deploys`) before it takes its worker out and drops
it only once the worker is back and healthy in the router, so whoever reads the file first and the router's
`/workers` after it never counts a worker that a deploy holds out as serving.

opsctl.rollout.rolling changes the file before it takes a worker out and before it puts one back, so the file never
lists fewer workers than the router is kept from; a worker left out because it serves nothing healthy stays under
`kept_out`, as it stays out of the router. `opsctl status --router` shows the file's workers and leases;
`router remove` deletes it.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from opsctl.commands import sh
from opsctl.deploy.lock import LockInfo
from opsctl.errors import DeployError
from opsctl.inventory.model import Host, Inventory, Router
from opsctl.remote.base import Connection
from opsctl.remote.held import HeldConnections
from opsctl.router.api import Member

KEPT_OUT_DIR = "/var/lib/opsctl/routers"
SWAP_LOCK_WAIT_S = 20  # flock's wait for another opsctl's swap (each holds it for one cat, one sha256, one mv)
SWAP_ATTEMPTS = 50  # a change that keeps losing the race this often is reported (never seen: each swap is ms)


def kept_out_file(router: str, directory: str = KEPT_OUT_DIR) -> str:
    return f"{directory}/{router}.kept-out.json"


@dataclass(frozen=True)
class Membership:
    """A router's kept-out file: the workers its next start leaves out, and the deploys holding a worker out now
    (url -> that deploy's lease: who, which process, since when)."""

    kept_out: frozenset[str] = frozenset()
    deploys: tuple[tuple[str, LockInfo], ...] = ()  # sorted by url

    def lease(self, url: str) -> LockInfo | None:
        return dict(self.deploys).get(url)

    def keeping(self, url: str, out: bool) -> Membership:
        return replace(self, kept_out=self.kept_out | {url} if out else self.kept_out - {url})

    def leasing(self, url: str, lease: LockInfo | None) -> Membership:
        leases = {u: info for u, info in self.deploys if u != url}
        if lease is not None:
            leases[url] = lease
        return replace(self, deploys=tuple(sorted(leases.items())))

    def to_json(self) -> str:
        deploys = {
            url: {"token": i.token, "holder": i.holder, "pid": i.pid, "since": i.since, "action": i.action}
            for url, i in self.deploys
        }
        return json.dumps({"kept_out": sorted(self.kept_out), "deploys": deploys}) + "\n"


def parse_membership(text: str) -> Membership:
    """A kept-out file; empty when it is absent, empty or not what opsctl writes (as the launcher reads it: an
    unreadable file keeps nobody out). A lease that does not parse is left out; files of older opsctl versions
    have no `deploys`."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return Membership()
    if not isinstance(data, dict):
        return Membership()
    urls = data.get("kept_out")
    kept = frozenset(urls) if isinstance(urls, list) and all(isinstance(u, str) for u in urls) else frozenset()
    leases: dict[str, LockInfo] = {}
    raw = data.get("deploys")
    for url, fields in raw.items() if isinstance(raw, dict) else ():
        if isinstance(fields, dict) and isinstance(fields.get("token"), str) and isinstance(url, str):
            pid = fields.get("pid")
            leases[url] = LockInfo(
                fields["token"], str(fields.get("holder", "?")), pid if isinstance(pid, int) else 0,
                str(fields.get("since", "?")), str(fields.get("action", "")),
            )  # fmt: skip
    return Membership(kept, tuple(sorted(leases.items())))


def parse_kept_out(text: str) -> tuple[str, ...]:
    """The URLs a router's next start leaves out (sorted)."""
    return tuple(sorted(parse_membership(text).kept_out))


def kept_out_json(urls: Iterable[str]) -> str:
    return Membership(frozenset(urls)).to_json()


# ---------------------------------------------------------------- the decision (pure)


class Verdict(StrEnum):
    TAKE = "take"  # take it out: `after` is the file to write
    WAIT = "wait"  # another deploy holds a worker out: look again later
    REFUSE = "refuse"  # it is the router's last healthy worker and no deploy will bring another back


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""  # WAIT: what it waits for; REFUSE: the members as refuse_take_out describes them
    after: Membership | None = None  # TAKE
    held_by: tuple[str, ...] = ()  # WAIT: the workers other deploys hold out (host/service where known)


def live_leases(state: Membership, url: str) -> dict[str, LockInfo]:
    """The other workers' leases whose deploy may still run (a lease of this machine whose process is gone is not;
    one of `url` itself is stale: its deploy holds the host's deploy lock, so no other deploy of it runs)."""
    return {u: info for u, info in state.deploys if u != url and info.holder_gone() is not True}


def refuse_take_out(members: Sequence[Member], url: str) -> str | None:
    """Why `url` must not leave the router (it is its last healthy worker), or None. A worker the router does not
    list as healthy serves no client, so taking it out costs nothing: the deploy that heals a router whose every
    worker is down is never refused."""
    if any(m.url != url and m.healthy for m in members):
        return None
    if not any(m.url == url and m.healthy for m in members):
        return None
    return ", ".join(f"{m.url} {'healthy' if m.healthy else 'unhealthy'}" for m in members)


def decide_take_out(
    state: Membership,
    members: Sequence[Member],
    url: str,
    lease: LockInfo,
    max_unavailable: int,
    kept_here: Iterable[str] = (),
    names: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> Decision:
    """May `url` leave the router now? `members` is the router's /workers read after `state` was read; `kept_here`
    the workers this process keeps out (a restarted router may list them again). A worker another deploy holds out,
    or one kept out, never counts as serving."""
    names = names or {}
    others = live_leases(state, url)
    when = now or datetime.now(UTC)
    held = "; ".join(
        f"{names.get(u, u)} out for a deploy by {info.describe(when)}" for u, info in sorted(others.items())
    )
    held_by = tuple(names.get(u, u) for u in sorted(others))
    if len(others) >= max_unavailable:
        reason = f"{len(others)} worker(s) out already (max_unavailable {max_unavailable}): {held}"
        return Decision(Verdict.WAIT, reason, held_by=held_by)
    out = (state.kept_out | set(others) | set(kept_here)) - {url}
    refused = refuse_take_out([m for m in members if m.url not in out], url)
    if refused is not None:
        if others:
            return Decision(Verdict.WAIT, f"no other worker serves until it is back: {held}", held_by=held_by)
        return Decision(Verdict.REFUSE, refused)
    stale = [u for u, info in state.deploys if u != url and u not in others]
    after = state.keeping(url, True).leasing(url, lease)
    for u in stale:  # their opsctl is gone (this machine); what they kept out stays kept out
        after = after.leasing(u, None)
    return Decision(Verdict.TAKE, after=after)


# ---------------------------------------------------------------- where the file lives


class MembershipStore(Protocol):
    """A router's membership file: read it with its version, write it only if the version is still the same."""

    def read(self, router: Router) -> tuple[str, Membership]: ...
    def swap(self, router: Router, version: str, after: Membership) -> bool: ...
    def close(self) -> None: ...


def change(store: MembershipStore, router: Router, edit: Callable[[Membership], Membership]) -> Membership:
    """Apply `edit` by compare-and-swap, reading again whenever another opsctl changed the file in between."""
    for _ in range(SWAP_ATTEMPTS):
        version, before = store.read(router)
        after = edit(before)
        if after == before or store.swap(router, version, after):
            return after
    raise DeployError(
        f"router {router.name}: its membership file on {router.host} kept changing under {SWAP_ATTEMPTS} attempts",
        "another opsctl is changing it in a loop: look for it (`opsctl status --router`)",
    )


def version_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def swap_script(path: str, version: str) -> str:
    """Replace `path` with stdin if its sha256 is still `version`; prints `swapped` or `changed`. Under flock on a
    lock file beside it, so two swaps never interleave their compare and their rename."""
    directory = path.rsplit("/", 1)[0]
    p, tmp, lock = shlex.quote(path), shlex.quote(path + ".tmp"), shlex.quote(path + ".lock")
    return (
        f"mkdir -p {shlex.quote(directory)} && exec 9>{lock} && flock -w {SWAP_LOCK_WAIT_S} 9 && "
        f'if [ "$(cat {p} 2>/dev/null | sha256sum | cut -d" " -f1)" = {shlex.quote(version)} ]; then '
        f"cat > {tmp} && chmod 644 {tmp} && mv -f {tmp} {p} && echo swapped; else echo changed; fi"
    )


class KeptOutRecorder:
    """Keeps routers' membership files on their hosts over SSH (one connection per host, kept until `close`)."""

    def __init__(
        self,
        inventory: Inventory,
        connect: Callable[[Host], Connection] | None = None,
        directory: str = KEPT_OUT_DIR,
    ) -> None:
        if connect is None:
            from opsctl.remote import connect as ssh_connect

            connect = ssh_connect
        self._conns = HeldConnections(inventory, connect)
        self._lock = threading.Lock()  # HeldConnections opens connections lazily: one opener at a time
        self.directory = directory

    def _conn(self, router: Router) -> Connection:
        with self._lock:
            return self._conns.get(router.host)

    def read(self, router: Router) -> tuple[str, Membership]:
        """Raises OpsctlError when the host cannot be read."""
        path = kept_out_file(router.name, self.directory)
        text = self._conn(router).run(sh(f"cat -- {shlex.quote(path)} 2>/dev/null || true", sudo=True), timeout=30)
        return version_of(text.stdout), parse_membership(text.stdout)

    def swap(self, router: Router, version: str, after: Membership) -> bool:
        path = kept_out_file(router.name, self.directory)
        cmd = sh(swap_script(path, version), sudo=True)
        out = self._conn(router).run(replace(cmd, stdin=after.to_json()), timeout=SWAP_LOCK_WAIT_S + 30).stdout
        if out.strip() not in ("swapped", "changed"):
            raise DeployError(f"router {router.name}: unexpected answer from the swap on {router.host}: {out[:200]!r}")
        return out.strip() == "swapped"

    def close(self) -> None:
        self._conns.close()


class MemoryMembership:
    """The membership files of one process (unit tests, and a guard that records nothing on hosts)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self._lock = threading.Lock()

    def read(self, router: Router) -> tuple[str, Membership]:
        with self._lock:
            text = self.files.get(router.name, "")
        return version_of(text), parse_membership(text)

    def swap(self, router: Router, version: str, after: Membership) -> bool:
        with self._lock:
            if version_of(self.files.get(router.name, "")) != version:
                return False
            self.files[router.name] = after.to_json()
            return True

    def close(self) -> None:
        pass
