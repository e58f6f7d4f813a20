"""`opsctl status` reports a router's release like a service's: a release that went live and never finished its
gates, and files of the current release (or the rollback target) edited on the host. Against the FakeHost of
test_router_deploy_checks, the router's files as a real deploy wrote them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from opsctl.cli.common import console, to_jsonable
from opsctl.cli.status import _router_table
from opsctl.commands import Cmd
from opsctl.deploy.lock import LockInfo
from opsctl.router.status import RouterStatus, collect_router, worker_names
from tests.unit.test_router_deploy import ROOT, SECRET, inventory
from tests.unit.test_router_deploy_checks import OLD, Releases, first_release

HOLDER = LockInfo("t0k3n", "ops@elsewhere", 4242, "2026-12-06T01:00:00Z", "deploy router front")
EDITED = "0" * 64


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RK", SECRET)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(console, "inventory", None)  # an earlier CLI test may have named its inventory there


def router_http() -> httpx.Client:
    """The router answering /health and listing its one worker, healthy."""
    inv = inventory()
    (url,) = worker_names(inv, inv.router("front"))

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/workers":
            return httpx.Response(200, json={"workers": [{"id": "w1", "url": url, "is_healthy": True, "load": 0}]})
        return httpx.Response(200)

    return httpx.Client(transport=httpx.MockTransport(handler))


def host(pending: bool = False, lock: LockInfo | None = None, edited: str = "") -> tuple[str, Releases]:
    """A router host whose current release is a real first deploy's (its gates unfinished when `pending`), `OLD`
    a copy of it that passed its gates (the rollback target). The hashing command answers the digests the
    manifests recorded, but EDITED for the unit of the `edited` release ("current" or "target"); the lock holder
    file holds `lock`."""
    rid, files = first_release()
    flags = {OLD: "0 1 0", rid: "0 1 1" if pending else "0 1 0"}
    edited = {"current": f"{rid}/unit", "target": f"{OLD}/unit"}.get(edited, "")
    files = {**files, **{p.replace(rid, OLD): f for p, f in files.items() if f"/releases/{rid}/" in p}}
    recorded = json.loads(files[f"{ROOT}/releases/{rid}/manifest.json"][0])["files"]
    releases = Releases(rid, flags, files)

    def answer(cmd: Cmd) -> Any:
        shown = cmd.display()
        if "hashlib" in shown:
            labels = re.findall(r"(\S+?/[\w.-]+)=/", shown)
            digest = {lb: EDITED if lb == edited else recorded[lb.partition("/")[2]] for lb in labels}
            unit = recorded["unit"]
            return (0, "".join(f"{lb}\t{d}\n" for lb, d in digest.items()) + f"installed unit\t{unit}\n", "")
        if "deploy.lock/holder" in shown:
            return (0, lock.render() if lock else "", "")
        return releases.answer(cmd)

    releases.handler = answer
    return rid, releases


def collect(releases: Releases) -> RouterStatus:
    inv = inventory()
    return collect_router(releases, inv, inv.router("front"), router_http())  # type: ignore[arg-type]


def printed(row: RouterStatus) -> list[str]:
    with console.capture() as out:
        _router_table([row])
    return [line.strip() for line in out.get().splitlines()[1:] if not line.strip().startswith("member ")]


def test_a_clean_router_is_neither_pending_nor_drifted_and_its_files_were_hashed() -> None:
    rid, releases = host()
    row = collect(releases)
    assert (row.current, row.rollback_to, row.healthy) == (rid, OLD, True)
    assert (row.gates_pending, row.drift, row.lock, row.failing) == (False, [], None, False)
    hashed = [line for line in releases.ran if "hashlib" in line]
    assert len(hashed) == 1 and f"{rid}/router.json=" in hashed[0] and f"{OLD}/router.json=" in hashed[0]
    assert printed(row) == []


def test_a_router_whose_gates_never_finished_fails_status_and_names_the_deploy() -> None:
    """Before: status printed nothing about it and exited 0."""
    rid, releases = host(pending=True)
    row = collect(releases)
    assert (row.gates_pending, row.healthy, row.deploying, row.failing) == (True, True, False, True)
    assert printed(row) == [
        f"h1/router front: release {rid} went live but never finished its gates (interrupted): "
        "`opsctl deploy -i INVENTORY --router front` runs them, or rolls back"
    ]
    assert to_jsonable(row)["gates_pending"] is True


def test_a_router_going_through_its_gates_under_a_deploy_is_not_a_failure() -> None:
    rid, releases = host(pending=True, lock=HOLDER)
    row = collect(releases)
    assert row.lock is not None and row.lock.startswith("ops@elsewhere pid 4242 (deploy router front)")
    assert (row.gates_pending, row.deploying, row.failing) == (True, True, False)
    (line,) = printed(row)
    assert line.startswith(f"h1/router front: a deploy is in progress (release {rid} is going through its gates; ")
    assert line.endswith("not counted as a failure until it ends")


@pytest.mark.parametrize("edited", ["current", "target"])
def test_a_router_release_edited_on_the_host_is_drift(edited: str) -> None:
    """Before: a hand-edited router.json or unit was found only by the next deploy."""
    rid, releases = host(edited=edited)
    row = collect(releases)
    changed = rid if edited == "current" else OLD
    prefix = "" if edited == "current" else "rollback target "
    line = f"{prefix}release {changed}: unit changed on the host since the deploy"
    assert len(row.drift) == 1 and row.drift[0].startswith(line)
    assert row.healthy and row.failing and to_jsonable(row)["drift"] == row.drift
    fix = (
        "writes the current release's files again"
        if edited == "current"
        else f"marks the drifted rollback target {OLD} BAD (rollback then goes to the release before it)"
    )
    deploy = "`opsctl deploy -i INVENTORY --router front`"
    assert printed(row) == [f"h1/router front: {row.drift[0]}", f"h1/router front: {deploy} {fix}"]
