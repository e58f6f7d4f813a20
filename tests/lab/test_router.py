"""Zero-downtime deploys behind the real sglang-router 0.3.2, on 2 lab hosts, through the real CLI.

lab1 and lab2 each serve the tiny model (`ref`); the router `front` runs on lab1 and fronts both; lab2 also
runs a baseline service (`base`, not behind the router) for the equivalence check. A bounded steady client
(10 chat completions/s, at most 120 s, opsctl.bench.steady) runs through the router while `opsctl deploy
--mode shadow` and then `--mode tree` roll through both services: no request may fail. For contrast the same
client straight against lab1/ref during its plain deploy (no router) shows the outage. Then a release that
fails its gate behind the router: no failed request, the worker back on its old release and in the router.

Numbers go to .out/router_lab.json (docs/results/deploy-lab.md quotes them).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from opsctl.bench.steady import SteadyClient, SteadyReport
from tests.lab.deploy_support import (
    REPO,
    add_service,
    crash_fault_installed,
    current_mode,
    current_release,
    derived_inventory,
    opsctl,
    provision,
    service,
    tune,
)

pytestmark = pytest.mark.lab

ROUTER_PORT = 30080
OUT = REPO / ".out" / "router_lab.json"
RESULTS: dict[str, Any] = {}


def _with_router(doc: dict[str, Any]) -> None:
    add_service(doc, "lab2", "base", 30001, mode="baseline")
    doc["hosts"]["lab2"]["services"]["base"].pop("draft_model", None)
    tune(doc)
    doc["routers"] = {
        "front": {
            "host": "lab1",
            "port": ROUTER_PORT,
            "services": ["lab1/ref", "lab2/ref"],
            "policy": "round_robin",
            "drain_timeout": 30,
            "health_timeout": 120,
        }
    }


@pytest.fixture(scope="module")
def router_inventory(lab_hosts, tmp_path_factory) -> Path:
    inv = derived_inventory(tmp_path_factory.mktemp("router") / "lab.yaml", _with_router)
    result = provision(inv)
    assert result.returncode == 0, result.stderr[-3000:]
    first = opsctl("deploy", "-i", str(inv), "--service", "ref", "--mode", "tree", timeout=1500)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "lab1/router front: deployed" in first.stderr or "router front: unchanged" in first.stderr, first.stderr
    base = opsctl("deploy", "-i", str(inv), "--service", "base", timeout=1500)
    assert base.returncode == 0, base.stderr[-4000:]
    return inv


def _address(inv: Path, host: str) -> str:
    import yaml

    return str(yaml.safe_load(inv.read_text())["hosts"][host]["address"])


def _members(inv: Path) -> dict[str, bool]:
    body = httpx.get(f"http://{_address(inv, 'lab1')}:{ROUTER_PORT}/workers", timeout=10).json()
    return {w["url"]: w["is_healthy"] for w in body["workers"]}


@contextmanager
def steady(url: str, rate: float = 10, max_s: float = 120) -> Iterator[SteadyClient]:
    client = SteadyClient(url, rate=rate, max_s=max_s)
    client.start()
    try:
        yield client
    finally:
        client.finish()


def _record(name: str, report: SteadyReport, **extra: Any) -> None:
    RESULTS[name] = {
        "sent": report.sent, "failed": report.failed, "causes": report.causes,
        "duration_s": round(report.duration_s, 1), "longest_gap_s": round(report.longest_gap_s, 1), **extra,
    }  # fmt: skip
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(RESULTS, indent=1) + "\n")


def test_rolling_deploy_behind_the_router_drops_nothing(router_inventory: Path) -> None:
    inv = str(router_inventory)
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    assert set(_members(router_inventory).values()) == {True} and len(_members(router_inventory)) == 2
    for mode in ("shadow", "tree"):
        before = {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")}
        t0 = time.monotonic()
        with steady(router) as client:
            result = opsctl("deploy", "-i", inv, "--service", "ref", "--mode", mode, timeout=1500)
            deploy_s = time.monotonic() - t0
        report = client.report
        _record(f"router_{mode}", report, deploy_rc=result.returncode, deploy_s=round(deploy_s, 1))
        assert result.returncode == 0, result.stderr[-4000:]
        assert "lab1/ref: deployed" in result.stderr and "lab2/ref: deployed" in result.stderr
        assert "out of router front" in result.stderr and "back in router front" in result.stderr
        assert "drained in" in result.stderr or "still in flight" in result.stderr
        assert report.sent >= 20, report.summary()
        assert report.failed == 0, report.summary()
        for h in ("lab1", "lab2"):
            assert current_release(router_inventory, h, "ref") != before[h]
            assert current_mode(router_inventory, h, "ref") == mode
        assert set(_members(router_inventory).values()) == {True} and len(_members(router_inventory)) == 2
    eq = opsctl("smoke", "-i", inv, "--service", "ref", "--equivalence", "--baseline", "lab2/base",
                "--prompts", str(REPO / "inventory" / "lab-prompts.yaml"), "--json")  # fmt: skip
    assert eq.returncode == 0, eq.stderr[-3000:]
    status = opsctl("status", "-i", inv, "--router", "front", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    (row,) = json.loads(status.stdout)["routers"]
    assert row["healthy"] and {m["worker"] for m in row["members"]} == {"lab1/ref", "lab2/ref"}
    through = opsctl("smoke", "-i", inv, "--router", "front", "--json")
    assert through.returncode == 0 and json.loads(through.stdout)[0]["ok"], through.stderr[-2000:]


def test_without_a_router_the_deploy_is_an_outage(router_inventory: Path, tmp_path: Path) -> None:
    """Contrast: the same client straight at lab1/ref while it is redeployed (no router in front)."""
    plain = derived_inventory(tmp_path / "plain.yaml", lambda d: (_with_router(d), d.pop("routers")))
    direct = f"http://{_address(router_inventory, 'lab1')}:30000"
    with steady(direct) as client:
        result = opsctl("deploy", "-i", str(plain), "--host", "lab1", "--service", "ref", "--mode", "shadow",
                        timeout=1500)  # fmt: skip
    _record("direct_shadow", client.report, deploy_rc=result.returncode)
    assert result.returncode == 0, result.stderr[-4000:]
    assert client.report.failed > 0, client.report.summary()
    # the next test's deploy puts lab1/ref back on the router inventory's release


def _listed_runs(samples: list[tuple[float, bool, bool]]) -> list[float]:
    """How long each run of consecutive samples (time, listed, gates passed) that saw the worker listed before its
    gates passed lasted (s); a run the end of the gates cut short counts up to there."""
    runs, start = [], None
    for t, listed, passed in samples:
        if listed and not passed and start is None:
            start = t
        elif (passed or not listed) and start is not None:
            runs.append(t - start)
            start = None
    return runs


def test_router_restarted_mid_deploy_never_keeps_an_ungated_worker(router_inventory: Path) -> None:
    """Before the fix, a router killed during a rolling deploy came back (systemd's Restart=) with every worker of its
    --worker-urls, the one in its gates included (31 failed requests of 250), and neither the deploy nor status
    said so; with a membership watcher alone it still listed that worker for 0.3-0.5 s after its restart. Now
    opsctl records the workers it keeps out on the router's host before it takes one out, and the router's
    launcher starts without them. lab1/ref's new server is held in its loading phase while the router is killed:
    systemd restarts it without lab1/ref, status shows lab1/ref kept out, the router never lists it until its
    smoke gate passed, and the deploy puts it back; status shows the restart. (This deploy also puts lab1/ref
    back on the router inventory's release after the plain deploy of the test before.)"""
    from opsctl.commands import Cmd
    from tests.lab.deploy_support import background, loading_held, remote_run, unit_props

    inv = str(router_inventory)
    lab1 = f"http://{_address(router_inventory, 'lab1')}:30000"
    unit = "opsctl-router-front.service"
    restarts = int(unit_props(router_inventory, "lab1", unit)["NRestarts"])
    samples: list[tuple[float, bool, bool]] = []  # (time, lab1/ref listed, its smoke gate passed)
    stop = threading.Event()

    def sample(said: list[str]) -> None:  # the router's members every 0.2 s, from the kill until the deploy ends
        while not stop.wait(0.2):
            passed = any("lab1/ref: smoke ok" in line for line in list(said))
            try:
                samples.append((time.monotonic(), lab1 in _members(router_inventory), passed))
            except httpx.HTTPError:
                pass  # the router is down

    with loading_held(router_inventory, "lab1", "opsctl-ref.service") as release:
        deploy = background("deploy", "-i", inv, "--host", "lab1", "--service", "ref", "--mode", "tree", "--force",
                            "--readiness-delay", "8")  # fmt: skip
        deploy.wait_for("lab1/ref: restarted in", timeout=600)
        assert lab1 not in _members(router_inventory)
        remote_run(router_inventory, "lab1", Cmd.of("systemctl", "kill", "--signal", "KILL", unit))
        sampler = threading.Thread(target=sample, args=(deploy.lines,), daemon=True)
        sampler.start()
        try:
            deadline = time.monotonic() + 120
            while not (samples and int(unit_props(router_inventory, "lab1", unit)["NRestarts"]) > restarts):
                assert time.monotonic() < deadline, f"router not back: {unit_props(router_inventory, 'lab1', unit)}"
                time.sleep(0.5)
            assert not samples[-1][1]  # back, without the worker whose gates are running
            kept = opsctl("status", "-i", inv, "--router", "front")
            assert "kept out by opsctl (a restart of the router starts without them): lab1/ref" in kept.stderr, (
                kept.stderr[-2000:]
            )
            release()
            code = deploy.finish()
        finally:
            stop.set()
            sampler.join(timeout=10)
    text = deploy.text
    assert code == 0, text[-4000:]
    assert "lists lab1/ref again" not in text, text[-4000:]  # the watcher never had to take it out
    assert text.index("lab1/ref: smoke ok") < text.index("lab1/ref: back in router front"), text[-4000:]
    runs = _listed_runs(samples)
    RESULTS["router_restart_listed_before_gates_s"] = [round(r, 1) for r in runs]
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(RESULTS, indent=1) + "\n")
    # Once listed, lab1/ref stays listed: that is its put-back after the smoke gate. A restarted router that took it
    # back would have it listed, then taken out by the watcher (said above). `passed` comes from the deploy's
    # output as this process reads it, which a loaded machine delays by up to a second or so: not the bound here.
    first = next((i for i, (_, listed, _) in enumerate(samples) if listed), None)
    assert first is not None and all(listed for _, listed, _ in samples[first:]), samples
    journal = remote_run(router_inventory, "lab1", Cmd.of("journalctl", "-u", unit, "--no-pager", "-o", "cat"))
    assert f"opsctl: kept out of this router until their deploy passes its gates: {lab1}" in journal
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members
    assert current_mode(router_inventory, "lab1", "ref") == "tree"
    human = opsctl("status", "-i", inv, "--router", "front")
    assert f"restarts={restarts + 1} since " in human.stderr, human.stderr[-2000:]
    assert "kept out by opsctl" not in human.stderr, human.stderr[-2000:]


def test_failed_gate_behind_the_router_restores_the_old_release_in_the_router(
    router_inventory: Path, tmp_path: Path
) -> None:
    def crash(doc: dict[str, Any]) -> None:
        _with_router(doc)
        service(doc, "lab2", "ref")["extra_env"] = {"OPSCTL_FAULT_CRASH": "30000:1"}  # before the 3 s re-check

    faulty = derived_inventory(tmp_path / "crash.yaml", crash)
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    before = current_release(router_inventory, "lab2", "ref")
    with crash_fault_installed(router_inventory, "lab2"), steady(router) as client:
        result = opsctl("deploy", "-i", str(faulty), "--host", "lab2", "--service", "ref", "--mode", "tree")
    _record("router_failed_gate", client.report, deploy_rc=result.returncode)
    assert result.returncode == 1, result.stderr[-4000:]
    assert "lab2/ref: rolled-back" in result.stderr, result.stderr[-4000:]
    assert "back in router front" in result.stderr
    assert client.report.failed == 0, client.report.summary()
    assert current_release(router_inventory, "lab2", "ref") == before
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members


def test_last_healthy_worker_is_never_taken_out(router_inventory: Path) -> None:
    """With lab2/ref stopped, deploying lab1/ref would leave the router nobody: refused, nothing switched."""
    from opsctl.commands import Cmd
    from tests.lab.deploy_support import remote_run

    before = current_release(router_inventory, "lab1", "ref")
    router_before = current_release(router_inventory, "lab1", "router-front")
    remote_run(router_inventory, "lab2", Cmd.of("systemctl", "stop", "opsctl-ref.service"))
    try:
        done = threading.Event()
        for _ in range(60):  # the router marks it unhealthy after its failure threshold (interval 2 s)
            if not _members(router_inventory).get(f"http://{_address(router_inventory, 'lab2')}:30000", True):
                done.set()
                break
            threading.Event().wait(1)
        assert done.is_set(), _members(router_inventory)
        result = opsctl("deploy", "-i", str(router_inventory), "--host", "lab1", "--service", "ref", "--force")
        assert result.returncode == 1
        assert "last healthy worker" in result.stderr and "nothing switched" in result.stderr, result.stderr[-3000:]
        assert current_release(router_inventory, "lab1", "ref") == before
        assert current_release(router_inventory, "lab1", "router-front") == router_before  # --force: services only
    finally:
        remote_run(router_inventory, "lab2", Cmd.of("systemctl", "start", "opsctl-ref.service"))


@contextmanager
def slowed_ssh(host: str, rate: str) -> Iterator[None]:
    """`host`'s SSH answers (its egress from port 22) limited to `rate` by htb in its network namespace; its other
    traffic (the router's and the worker's HTTP) untouched. Removed when the block ends."""
    from tests.lab import lab_parts

    netns = lab_parts.lab_config().netns(host)
    script = (
        "tc qdisc replace dev host0 root handle 1: htb default 10 && "
        "tc class add dev host0 parent 1: classid 1:10 htb rate 1gbit && "
        f"tc class add dev host0 parent 1: classid 1:20 htb rate {rate} ceil {rate} && "
        "tc filter add dev host0 protocol ip parent 1: prio 1 u32 match ip sport 22 0xffff flowid 1:20"
    )
    subprocess.run(["ip", "netns", "exec", netns, "sh", "-c", script], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", "host0", "root"], timeout=30)


@contextmanager
def healthy_members_sampled(inv: Path) -> Iterator[list[int]]:
    """The router's healthy members counted every 0.2 s while the block runs (-1: the router did not answer)."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            try:
                samples.append(sum(_members(inv).values()))
            except httpx.HTTPError:
                samples.append(-1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=10)


def _wait_both_healthy(inv: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (len(members := _members(inv)) == 2 and all(members.values())):
        assert time.monotonic() < deadline, members
        time.sleep(1)


def test_two_operators_deploying_behind_one_router_take_turns_and_never_empty_it(router_inventory: Path) -> None:
    """Before, the last-healthy check and the router's slot were locks of one opsctl process: a second operator's
    deploy of lab2/ref, while lab1/ref was out for its own deploy, was refused ("last healthy worker") and its good
    release marked BAD, or (a slow router host) both took their worker out and /workers was empty for 9-10 s.
    Now the router's membership file on lab1 serializes them: lab1's SSH answers limited to 64 kbit/s and lab1/ref's
    new server held loading, the second deploy says it waits, goes once lab1/ref is back, and both succeed; the
    router never has no healthy worker and no client request fails. `status` during the deploy says a deploy is in
    progress and exits 0 (before: "interrupted", exit 1)."""
    from tests.lab.deploy_support import background, is_bad, loading_held

    inv = str(router_inventory)
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    _wait_both_healthy(router_inventory)  # the test before restarts lab2/ref: the router re-checks it every 2 s
    before = {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")}
    with (
        loading_held(router_inventory, "lab1", "opsctl-ref.service") as release,
        slowed_ssh("lab1", "64kbit"),
        healthy_members_sampled(router_inventory) as samples,
        steady(router, rate=3, max_s=900) as client,
    ):
        first = background("deploy", "-i", inv, "--host", "lab1", "--service", "ref", "--force")
        second: Any = None
        try:
            first.wait_for("lab1/ref: restarted in", timeout=900)
            status = opsctl("status", "-i", inv, "--host", "lab1", "--service", "ref")
            second = background("deploy", "-i", inv, "--host", "lab2", "--service", "ref", "--force")
            second.wait_for("lab2/ref: waiting for router front", timeout=600)
        finally:
            release()
            codes = [first.finish(timeout=900), second.finish(timeout=900) if second is not None else None]
    RESULTS["two_operators"] = {"samples": len(samples), "min_healthy": min(samples), "sent": client.report.sent,
                                "failed": client.report.failed}  # fmt: skip
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(RESULTS, indent=1) + "\n")
    assert codes == [0, 0], first.text[-3000:] + "\n----\n" + second.text[-3000:]
    assert status.returncode == 0, status.stderr[-2000:]
    assert "lab1/ref: a deploy is in progress" in status.stderr and "interrupted" not in status.stderr, status.stderr
    assert "last healthy worker" not in second.text and "router front: free after" in second.text, second.text[-3000:]
    assert samples and min(samples) >= 1, samples  # never empty, never down
    assert client.report.failed == 0, client.report.summary()
    for h in ("lab1", "lab2"):
        now = current_release(router_inventory, h, "ref")
        assert now != before[h] and not is_bad(router_inventory, h, "ref", now)
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members


def test_two_deploys_started_together_over_a_slow_router_link_never_empty_it(router_inventory: Path) -> None:
    """Both started in the same second, lab1's SSH answers at 16 kbit/s (the router's membership file is read and
    swapped over it), each worker out for at least its 20 s readiness delay, so their windows overlap: one takes
    its worker out, the other waits; both exit 0; the router always has a healthy worker and the file lists nobody
    at the end."""
    from opsctl.commands import Cmd
    from tests.lab.deploy_support import background, remote_run

    inv = str(router_inventory)
    _wait_both_healthy(router_inventory)
    with slowed_ssh("lab1", "16kbit"), healthy_members_sampled(router_inventory) as samples:
        runs = [
            background("deploy", "-i", inv, "--host", h, "--service", "ref", "--force", "--readiness-delay", "20")
            for h in ("lab1", "lab2")
        ]
        codes = [run.finish(timeout=1500) for run in runs]
    texts = "\n----\n".join(run.text[-3000:] for run in runs)
    print(texts)
    RESULTS["together_slow_link"] = {"samples": len(samples), "min_healthy": min(samples or [0])}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(RESULTS, indent=1) + "\n")
    assert codes == [0, 0], texts
    assert samples and min(samples) >= 1, samples
    assert sum("waiting for router front" in run.text for run in runs) == 1, texts
    kept = remote_run(router_inventory, "lab1", Cmd.of("cat", "/var/lib/opsctl/routers/front.kept-out.json"))
    assert json.loads(kept) == {"kept_out": [], "deploys": {}}, kept


def test_a_stopped_router_is_started_again_by_its_deploy(router_inventory: Path) -> None:
    """Before, after `systemctl stop` of the router, `opsctl deploy --router front` (the runbook's fix) exited 1
    with "unchanged config ... connection refused", and its hint (`opsctl deploy --force`) restarted every
    service and left the router down. Now the unchanged release is started again and gated."""
    from opsctl.commands import Cmd
    from tests.lab.deploy_support import remote_run

    inv = str(router_inventory)
    release = current_release(router_inventory, "lab1", "router-front")
    remote_run(router_inventory, "lab1", Cmd.of("systemctl", "stop", "opsctl-router-front.service"))
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}/health", timeout=10)
    down = opsctl("status", "-i", inv, "--router", "front")
    assert down.returncode == 1 and f"opsctl deploy -i {inv} --router front" in down.stderr, down.stderr[-2000:]
    result = opsctl("deploy", "-i", inv, "--router", "front")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is inactive/dead (" in result.stderr and ": starting release" in result.stderr, result.stderr[-3000:]
    assert "lab1/router front: unchanged" in result.stderr and "started again" in result.stderr, result.stderr[-3000:]
    assert current_release(router_inventory, "lab1", "router-front") == release
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members


def test_a_router_left_out_of_the_inventory_is_shown_and_removed(router_inventory: Path, tmp_path: Path) -> None:
    """A router deleted from `routers:` kept running and vanished from `status`. Now status names it
    (exit 1) with the command, `router remove` refuses while the inventory still has it, and removes it. It
    deploys the router again afterwards (a first deploy: its releases went too) for the tests after it."""

    def without_router(doc: dict[str, Any]) -> None:
        _with_router(doc)
        doc.pop("routers")

    gone = str(derived_inventory(tmp_path / "no-router.yaml", without_router))
    try:
        shown = opsctl("status", "-i", gone, "--host", "lab1")
        assert shown.returncode == 1, shown.stderr[-3000:]
        assert "lab1/router front: not in the inventory but installed (active/running)" in shown.stderr
        assert "opsctl router remove front --host lab1" in shown.stderr
        refused = opsctl("router", "remove", "front", "--host", "lab1", "-i", str(router_inventory))
        assert refused.returncode == 1 and "still in the inventory" in refused.stderr, refused.stderr[-2000:]
        plan = opsctl("router", "remove", "front", "--host", "lab1", "-i", gone, "--plan")
        assert plan.returncode == 2 and "systemctl disable --now" in plan.stderr, plan.stderr[-2000:]
        assert (
            httpx.get(f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}/health", timeout=10).status_code
            == 200
        )
        removed = opsctl("router", "remove", "front", "--host", "lab1", "-i", gone)
        assert removed.returncode == 0 and "stopped and removed" in removed.stderr, removed.stderr[-2000:]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}/health", timeout=10)
        after = opsctl("status", "-i", gone, "--host", "lab1")
        assert "router front" not in after.stderr and after.returncode == 0, after.stderr[-3000:]
    finally:
        back = opsctl("deploy", "-i", str(router_inventory), "--router", "front")
    assert back.returncode == 0, back.stderr[-3000:]


def test_router_release_that_cannot_start_is_rolled_back(router_inventory: Path, tmp_path: Path) -> None:
    """The router's own deploy is gated too: listening on an address lab1 does not have makes the new release
    crash-loop; the previous router release comes back and serves. Then `opsctl rollback --router` works."""

    def elsewhere(doc: dict[str, Any]) -> None:
        _with_router(doc)
        doc["routers"]["front"]["bind"] = doc["hosts"]["lab2"]["address"]

    bad = derived_inventory(tmp_path / "bad-router.yaml", elsewhere)
    before = current_release(router_inventory, "lab1", "router-front")
    result = opsctl("deploy", "-i", str(bad), "--router", "front")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "lab1/router front: rolled-back" in result.stderr, result.stderr[-3000:]
    assert current_release(router_inventory, "lab1", "router-front") == before
    through = opsctl("smoke", "-i", str(router_inventory), "--router", "front", "--json")
    assert through.returncode == 0 and json.loads(through.stdout)[0]["ok"], through.stderr[-2000:]
    refused = opsctl("rollback", "-i", str(router_inventory), "--router", "front")
    if refused.returncode == 0:  # a reused lab: an older good router release exists
        assert "lab1/router front: reverted" in refused.stderr, refused.stderr[-3000:]
        assert current_release(router_inventory, "lab1", "router-front") != before
    else:
        # A fresh lab: the router has one good release, so there is nothing to roll back to (one line, exit 1).
        assert "nothing to roll back to" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr

        def random_policy(doc: dict[str, Any]) -> None:
            _with_router(doc)
            doc["routers"]["front"]["policy"] = "random"

        other = derived_inventory(tmp_path / "random.yaml", random_policy)
        changed = opsctl("deploy", "-i", str(other), "--router", "front")
        assert changed.returncode == 0 and "lab1/router front: deployed" in changed.stderr, changed.stderr[-3000:]
        back = opsctl("rollback", "-i", str(router_inventory), "--router", "front")
        assert back.returncode == 0 and "lab1/router front: reverted" in back.stderr, back.stderr[-3000:]
        assert current_release(router_inventory, "lab1", "router-front") == before
    again = opsctl("deploy", "-i", str(router_inventory), "--router", "front")  # back to the inventory's config
    assert again.returncode == 0, again.stderr[-3000:]


def test_a_router_deploy_killed_mid_gate_is_finished_by_the_next_deploy(router_inventory: Path, tmp_path: Path) -> None:
    """opsctl killed (SIGKILL) while a new router release is in its gate: the release is live and untested. Before,
    the next deploy of the same configuration called it "unchanged"; now (as a service's) the marker written at the
    switch makes that deploy run the router's gates on what runs and keep it, gated."""
    from opsctl.commands import Cmd
    from tests.lab.deploy_support import background, remote_run

    def slow_gate(doc: dict[str, Any]) -> None:
        _with_router(doc)
        doc["routers"]["front"]["policy"] = "random"  # a new release
        doc["routers"]["front"]["readiness_delay"] = 20  # the gate's window for the kill

    changed = derived_inventory(tmp_path / "slow-gate.yaml", slow_gate)
    inv = str(changed)
    before = current_release(router_inventory, "lab1", "router-front")
    bg = background("deploy", "-i", inv, "--router", "front")
    try:
        bg.wait_for("lab1/router front: switching to", timeout=600)
        deadline = time.monotonic() + 60
        while current_release(router_inventory, "lab1", "router-front") == before:  # switched: in its gate now
            assert time.monotonic() < deadline, bg.text
            time.sleep(0.2)
    finally:
        bg.proc.kill()  # no finally of opsctl's runs: the lock and the untested release stay as they are
        bg.finish(timeout=60)
    untested = current_release(router_inventory, "lab1", "router-front")
    assert untested != before, bg.text
    root = "/opt/opsctl/services/router-front/releases"
    marker = Cmd.of("sh", "-c", f"test -e {root}/{untested}/GATES_PENDING && echo marked || echo unmarked")
    pending = remote_run(changed, "lab1", marker).strip()
    cleared = opsctl("deploy", "-i", inv, "--host", "lab1", "--break-lock")  # the killed deploy's lock
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    seen = opsctl("status", "-i", inv, "--router", "front", "--json")  # untested and no deploy runs: a failure
    (row,) = json.loads(seen.stdout)["routers"]
    assert (seen.returncode, row["current"], row["gates_pending"], row["drift"]) == (1, untested, True, []), seen
    again = opsctl("deploy", "-i", inv, "--router", "front")  # the same configuration
    assert again.returncode == 0, again.stderr[-3000:]
    seen = opsctl("status", "-i", inv, "--router", "front", "--json")
    (row,) = json.loads(seen.stdout)["routers"]
    assert (seen.returncode, row["gates_pending"], row["drift"]) == (0, False, []), seen
    assert "unchanged" not in again.stderr, again.stderr[-3000:]
    assert pending == "marked"  # written at the switch, before the restart
    assert f"release {untested} went live but never finished its gates: running them now" in again.stderr
    assert "lab1/router front: deployed" in again.stderr and "gates finished (interrupted before)" in again.stderr
    assert current_release(router_inventory, "lab1", "router-front") == untested
    assert remote_run(changed, "lab1", marker).strip() == "unmarked"  # tested now
    back = opsctl("deploy", "-i", str(router_inventory), "--router", "front")  # the module's configuration again
    assert back.returncode == 0 and "lab1/router front: deployed" in back.stderr, back.stderr[-3000:]
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members


@contextmanager
def faults_armed(inventory: Path, host: str) -> Iterator[None]:
    """The reference server's test faults (ddtree.serve.faults) armed on `host`: a server started while the
    marker exists honours OPSCTL_FAULT_* in its environment. The marker goes when the test ends."""
    from ddtree.serve import faults

    from opsctl.commands import Cmd
    from tests.lab.deploy_support import remote_run

    marker = faults.MARKER
    remote_run(inventory, host, Cmd.of("sh", "-c", f"mkdir -p {Path(marker).parent} && touch {marker}"))
    try:
        yield
    finally:
        remote_run(inventory, host, Cmd.of("rm", "-f", "--", marker))


def _with_canary(doc: dict[str, Any]) -> None:
    """Lab thresholds: 2 shared CPU cores make latencies swing several-fold between any two windows, so the
    ratios are wide here; the decision the test checks is the replay's (deterministic)."""
    _with_router(doc)
    doc["routers"]["front"]["canary"] = {
        "workers": 1, "window": 10, "min_requests": 1, "replay": 1, "max_ttft_ratio": 20, "max_itl_ratio": 20,
        "min_tok_s_ratio": 0.05, "min_tau_ratio": 0.05,
    }  # fmt: skip
    for host in ("lab1", "lab2"):  # DDTREE metrics lines every 2 rounds: tok/s and tau within a 10 s window
        service(doc, host, "ref").setdefault("ddtree", {})["log_interval"] = 2


def _canary_lines(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if "canary" in line)


def test_canary_promotes_a_good_release(router_inventory: Path, tmp_path: Path) -> None:
    """Behind the router, under steady traffic: shadow -> tree on lab1/ref alone first, compared with lab2/ref
    for 10 s (and a greedy request replayed on both: equal tokens), promoted. No client request fails. The
    client runs at 3 requests/s for up to 7 min: it must outlast the fleet's setup deploy and the canary's own
    (a 120 s client had stopped before the window opened: 1 and 0 requests measured, rolled back)."""
    canary_inv = derived_inventory(tmp_path / "canary.yaml", _with_canary)
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    # The fleet on shadow with the canary inventory's settings (a plain rolling deploy; unchanged if it is)
    setup = opsctl("deploy", "-i", str(canary_inv), "--service", "ref", "--mode", "shadow", timeout=1500)
    assert setup.returncode == 0, setup.stderr[-3000:]
    plan = opsctl("deploy", "-i", str(canary_inv), "--service", "ref", "--mode", "tree", "--canary", "--plan")
    assert plan.returncode == 2 and "canary behind router front: lab1/ref first" in plan.stderr, plan.stderr[-3000:]
    with steady(router, rate=3, max_s=420) as client:
        good = opsctl("deploy", "-i", str(canary_inv), "--service", "ref", "--mode", "tree", "--canary", timeout=1500)
    print(_canary_lines(good.stderr))
    _record("canary_good", client.report, deploy_rc=good.returncode)
    assert good.returncode == 0, good.stderr[-5000:]
    assert "canary behind router front: promoted" in good.stderr, good.stderr[-5000:]
    assert re.search(r"greedy replay +1/1 equal .* ok", good.stderr), _canary_lines(good.stderr)
    assert {current_mode(router_inventory, h, "ref") for h in ("lab1", "lab2")} == {"tree"}
    assert client.report.failed == 0, client.report.summary()
    status = opsctl("status", "-i", str(canary_inv), "--router", "front", "--json")
    (row,) = json.loads(status.stdout)["routers"]
    assert row["canary"]["phase"] == "promoted" and row["canary"]["table"], status.stdout[-2000:]


def _assert_canary_rolled_back(router_inventory: Path, name: str, bad: subprocess.CompletedProcess[str],
                               client: SteadyClient, before: dict[str, str], reason: str) -> None:  # fmt: skip
    """A bad canary's deploy: exit 1, rolled back by itself for `reason` (a regex over its table), both
    workers on their old releases and members of the router, and no client request failed."""
    print(_canary_lines(bad.stderr))
    _record(name, client.report, deploy_rc=bad.returncode)
    assert bad.returncode == 1, bad.stderr[-5000:]
    assert "canary behind router front: rolled-back" in bad.stderr, bad.stderr[-5000:]
    assert re.search(reason, bad.stderr), _canary_lines(bad.stderr)
    assert {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")} == before
    assert client.report.failed == 0, client.report.summary()
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members


def test_canary_rolls_back_a_release_whose_tokens_differ(router_inventory: Path, tmp_path: Path) -> None:
    """A mode change (tree <-> shadow) on a release whose output tokens differ (a fault that flips them): the
    greedy replay differs, the canary is rolled back at once, by itself."""
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    mode = "shadow" if current_mode(router_inventory, "lab1", "ref") == "tree" else "tree"

    def flipped(doc: dict[str, Any]) -> None:
        _with_canary(doc)
        service(doc, "lab1", "ref")["extra_env"] = {"OPSCTL_FAULT_FLIP": "1"}

    bad_inv = derived_inventory(tmp_path / "flipped.yaml", flipped)
    before = {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")}
    with faults_armed(router_inventory, "lab1"), steady(router, rate=3, max_s=420) as client:
        bad = opsctl("deploy", "-i", str(bad_inv), "--service", "ref", "--mode", mode, "--canary", timeout=1500)
    _assert_canary_rolled_back(router_inventory, "canary_tokens_differ", bad, client, before,
                               r"greedy replay +0/1 equal .* FAIL")  # fmt: skip


def test_canary_rolls_back_a_much_slower_release(router_inventory: Path, tmp_path: Path) -> None:
    """Same mode (no replay), but lab1/ref's release sleeps 1 s inside every decode round's target forward (as
    a slow flag would be: its own DDTREE tok/s sees it): its tok/s and inter-token latency fall behind the old
    group's, and it is rolled back by itself. Judged on tok/s at 0.6x: the engine's own round timings compare
    compute with compute, so the machine's load slows both groups alike (a loaded CI run, with the sleep
    outside the round: tok/s 0.84x and ITL p95 1.01x from 5 requests, promoted). The client runs at 1
    request/s: the reference server answers one request at a time, and faster the slowed canary's queue
    would outgrow the client's timeout before the window closes."""
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    mode = current_mode(router_inventory, "lab2", "ref")

    def slowed(doc: dict[str, Any]) -> None:
        _with_canary(doc)
        # a loaded old group: round ~0.5-0.7 s (tok/s 11-16), so the canary's is ~0.3-0.4x; 0.6x leaves room
        doc["routers"]["front"]["canary"].update(window=20, min_requests=5, max_itl_ratio=1.3, min_tok_s_ratio=0.6)
        service(doc, "lab1", "ref")["extra_env"] = {"OPSCTL_FAULT_DELAY_MS": "1000"}

    slow_inv = derived_inventory(tmp_path / "slowed.yaml", slowed)
    # Both on the canary inventory's settings first (DDTREE lines every 2 rounds: the old group's tok/s is
    # measured; run 3 without this: old tok/s `-`, not judged, and ITL p95 1750 vs 940 ms (1.86x) promoted it)
    setup = opsctl("deploy", "-i", str(derived_inventory(tmp_path / "canary.yaml", _with_canary)), "--service",
                   "ref", "--mode", mode, timeout=1500)  # fmt: skip
    assert setup.returncode == 0, setup.stderr[-3000:]
    before = {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")}
    with faults_armed(router_inventory, "lab1"), steady(router, rate=1, max_s=420) as client:
        bad = opsctl("deploy", "-i", str(slow_inv), "--service", "ref", "--mode", mode, "--canary", timeout=1500)
    _assert_canary_rolled_back(router_inventory, "canary_slow", bad, client, before,
                               r"canary: (ITL p95|tok/s) .* FAIL")  # fmt: skip


def test_canary_rolls_back_a_release_that_refuses_what_the_old_group_serves(
    router_inventory: Path, tmp_path: Path
) -> None:
    """Before the fix, a release with `--context-length 128` (every flag valid, the smoke prompt short) passed the
    canary: its error rate counted only aborts, its request count left out the 400s (clients lost 98 of 212 long
    requests). The judge reads the router's per-worker answers: the canary's refusals roll it back at once."""
    router = f"http://{_address(router_inventory, 'lab1')}:{ROUTER_PORT}"
    mode = current_mode(router_inventory, "lab2", "ref")

    def short_context(doc: dict[str, Any]) -> None:
        _with_canary(doc)
        doc["routers"]["front"]["canary"].update(window=60, min_requests=5, replay=0)
        service(doc, "lab1", "ref")["extra_args"] = ["--context-length", "128"]

    bad_inv = derived_inventory(tmp_path / "short-context.yaml", short_context)
    before = {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")}
    long_prompt = {
        "model": "default",
        "messages": [{"role": "user", "content": " ".join(["count the words of this sentence"] * 10)}],
        "max_tokens": 4,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    client = SteadyClient(router, rate=2, max_s=420, body=long_prompt)
    client.start()
    try:
        bad = opsctl("deploy", "-i", str(bad_inv), "--service", "ref", "--mode", mode, "--canary", timeout=1500)
    finally:
        client.finish()
    print(_canary_lines(bad.stderr))
    _record("canary_refuses", client.report, deploy_rc=bad.returncode)
    assert bad.returncode == 1, bad.stderr[-5000:]
    assert "canary behind router front: rolled-back" in bad.stderr, bad.stderr[-5000:]
    assert re.search(r"canary: refused +\d+ \([\d.]+%\) +0 \(0\.00%\) .* FAIL", bad.stderr), _canary_lines(bad.stderr)
    assert {h: current_release(router_inventory, h, "ref") for h in ("lab1", "lab2")} == before
    members = _members(router_inventory)
    assert len(members) == 2 and all(members.values()), members
    # what clients lost: the canary's 400s until it was rolled back, nothing else
    assert set(client.report.causes) <= {"HTTP 400"}, client.report.summary()
    assert 0 < client.report.failed < client.report.sent / 2, client.report.summary()
