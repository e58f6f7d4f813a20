"""Deploy faults on lab hosts, each through the real CLI: a bad flag, a crash after becoming healthy, a host
going down mid-deploy, Ctrl-C, a concurrent deploy, and an unchanged re-deploy."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from opsctl.lab import LabConfig
from tests.lab.deploy_support import (
    MODE,
    background,
    crash_fault_installed,
    current_mode,
    current_release,
    derived_inventory,
    is_bad,
    loading_held,
    lock_present,
    opsctl,
    polling,
    provision,
    provisioned_and_deployed,
    service,
    tune,
    unit_props,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def base_inventory(lab_hosts, tmp_path_factory) -> Path:
    return provisioned_and_deployed(tmp_path_factory.mktemp("faults") / "lab.yaml", tune)


def variant(base: Path, tmp_path: Path, mutate) -> Path:
    def change(doc):
        tune(doc)
        mutate(doc)

    return derived_inventory(tmp_path / "variant.yaml", change)


def _hosts(inv: Path) -> list[str]:
    import yaml

    return list(yaml.safe_load(inv.read_text())["hosts"])


def _health_url(inv: Path, host: str) -> str:
    import yaml

    return f"http://{yaml.safe_load(inv.read_text())['hosts'][host]['address']}:30000/health"


def test_unchanged_redeploy_restarts_nothing(base_inventory: Path) -> None:
    before = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    release = current_release(base_inventory, "lab1", "ref")
    result = opsctl("deploy", "-i", str(base_inventory), "--mode", MODE)
    assert result.returncode == 0, result.stderr[-3000:]
    for host in _hosts(base_inventory):
        assert f"{host}/ref: unchanged" in result.stderr
    after = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    assert after["NRestarts"] == before["NRestarts"]
    assert after["ActiveEnterTimestamp"] == before["ActiveEnterTimestamp"] and after["MainPID"] == before["MainPID"]
    assert current_release(base_inventory, "lab1", "ref") == release


def test_unchanged_redeploy_waits_for_a_service_still_starting(base_inventory: Path) -> None:
    # As right after a reboot: the unit is up but the server is still loading its model. The server stays in its
    # loading phase until the deploy has said it waits for it, whatever the machine's load: no race with the clock.
    from opsctl.commands import Cmd
    from tests.lab.deploy_support import remote_run

    with loading_held(base_inventory, "lab1", "opsctl-ref.service") as release:
        remote_run(base_inventory, "lab1", Cmd.of("systemctl", "restart", "opsctl-ref.service", sudo=True))
        deploy = background("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE)
        deploy.wait_for("/health does not answer yet: waiting", timeout=600)
        # the hold, not the clock: the server logs it right after its start-up line, which on a loaded machine can
        # come after the deploy began to wait (the unit is active while Python still imports)
        held, deadline = "", time.monotonic() + 120
        while "Loading held while /run/opsctl-test-hold-loading exists" not in held:
            assert time.monotonic() < deadline, held[-2000:]
            time.sleep(0.5)
            held = remote_run(base_inventory, "lab1", Cmd.of("journalctl", "-u", "opsctl-ref.service", "-n", "300"))
        release()
        code = deploy.finish()
    assert code == 0, deploy.text[-3000:]
    assert "lab1/ref: unchanged" in deploy.text and "was still starting; healthy after" in deploy.text
    assert unit_props(base_inventory, "lab1", "opsctl-ref.service")["ActiveState"] == "active"


def test_drift_is_reported_by_status_and_repaired_by_deploy(base_inventory: Path) -> None:
    """Before the fix, a hand-edited unit file and release env file left `status` at exit 0 and `deploy` "unchanged".
    Now status names each difference in one line and fails; deploy (no --force) writes a new release, says why,
    and the edited release is no rollback target afterwards."""
    from opsctl.commands import sh
    from tests.lab.deploy_support import remote_run

    inv = str(base_inventory)
    edited = current_release(base_inventory, "lab1", "ref")
    remote_run(base_inventory, "lab1", sh(
        "echo OMP_NUM_THREADS=4 >> /opt/opsctl/services/ref/current/env && "
        "sed -i 's/^RestartSec=.*/RestartSec=30/' /etc/systemd/system/opsctl-ref.service", sudo=True,
    ))  # fmt: skip
    status = opsctl("status", "-i", inv, "--host", "lab1", "--service", "ref")
    assert status.returncode == 1, status.stderr[-3000:]
    lines = status.stderr.splitlines()
    env = f"lab1/ref: release {edited}: env changed on the host since the deploy (sha256 "
    assert sum(line.startswith(env) for line in lines) == 1, status.stderr[-3000:]
    unit = f"lab1/ref: /etc/systemd/system/opsctl-ref.service differs from release {edited}'s unit (edited on the host)"
    assert unit in lines, status.stderr[-3000:]
    result = opsctl("deploy", "-i", inv, "--host", "lab1", "--mode", MODE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"lab1/ref: drift: release {edited}: env changed on the host" in result.stderr, result.stderr[-3000:]
    assert "deploying a new release to repair it" in result.stderr and "lab1/ref: deployed" in result.stderr
    assert f"drifted {edited} marked bad" in result.stderr
    assert current_release(base_inventory, "lab1", "ref") != edited
    after = opsctl("status", "-i", inv, "--host", "lab1", "--service", "ref", "--json")
    (row,) = json.loads(after.stdout)["services"]
    assert after.returncode == 0 and row["drift"] == [] and row["rollback_to"] != edited, after.stdout[-2000:]


def test_bad_flag_never_interrupts_the_old_release(base_inventory: Path, tmp_path: Path) -> None:
    bad = variant(base_inventory, tmp_path, lambda d: service(d, "lab1").update(extra_args=["--no-such-flag"]))
    release = current_release(base_inventory, "lab1", "ref")
    unit = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    with polling(_health_url(base_inventory, "lab1")) as poller:
        # answers from before the deploy began to after it ended, counted, not timed: a fixed sleep and a count
        # of polls in it raced the load (a slow /health answer, a quick refusal: fewer than 10)
        poller.wait_for(lambda polled: len(polled) > 0, "first /health answer", 120)
        result = opsctl("deploy", "-i", str(bad), "--host", "lab1", "--mode", MODE)
        ended = time.monotonic()
        poller.wait_for(lambda polled: len(polled) > 10 and polled[-1][0] > ended, "answer after the deploy", 120)
    assert result.returncode == 1
    assert "--no-such-flag" in result.stderr and "nothing switched" in result.stderr
    assert len(poller.results) > 10 and poller.failures == [], poller.failures  # HTTP 200 throughout
    assert unit_props(base_inventory, "lab1", "opsctl-ref.service") == unit  # the old server never restarted
    assert current_release(base_inventory, "lab1", "ref") == release
    failed = next(line for line in result.stderr.splitlines() if "staging" in line).split()[-1]
    assert is_bad(base_inventory, "lab1", "ref", failed)


def test_crash_after_healthy_is_caught_and_rolled_back(base_inventory: Path, tmp_path: Path) -> None:
    def crashy(doc):
        svc = service(doc, "lab1")
        svc["readiness_delay"] = 8  # the server dies 5 s after its first healthy answer
        svc["extra_env"] = {"OPSCTL_FAULT_CRASH": "30000:5"}

    inv = variant(base_inventory, tmp_path, crashy)
    previous = current_release(base_inventory, "lab1", "ref")
    with crash_fault_installed(base_inventory, "lab1"):
        result = opsctl("deploy", "-i", str(inv), "--host", "lab1", "--mode", MODE)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "lab1/ref: rolled-back" in result.stderr and "second check after 8s" in result.stderr
    assert "OPSCTL_FAULT_CRASH" in result.stderr  # the journal tail shows why
    assert f"rolled back to {previous} (healthy)" in result.stderr
    assert current_release(base_inventory, "lab1", "ref") == previous
    props = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    assert props["ActiveState"] == "active"
    status = opsctl("status", "-i", str(base_inventory), "--host", "lab1", "--json")
    assert status.returncode == 0 and '"healthy": true' in status.stdout
    (row,) = json.loads(status.stdout)["services"]
    assert row["unit"]["n_restarts"] == 0  # the failed release's crash loop is not counted against the restored one
    tail = result.stderr.split("--- journal tail", 1)[1]
    assert "GET /health" not in tail  # the gate's own probes are not what the operator needs to read


def test_ctrl_c_leaves_lock_released_and_previous_serving(base_inventory: Path) -> None:
    previous = current_release(base_inventory, "lab1", "ref")
    # Ctrl-C in the health gate, once the deploy says it is there: the new server is held in its loading phase
    # until then (not a sleep that hopes the gate has not passed yet), and let go once the rollback has begun.
    with loading_held(base_inventory, "lab1", "opsctl-ref.service") as release:
        bg = background("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE, "--force")
        bg.wait_for("lab1/ref: restarted in", timeout=300)
        bg.proc.send_signal(signal.SIGINT)
        bg.wait_for(f"lab1/ref: rolling back to {previous}", timeout=120)
        release()
        code = bg.finish(timeout=300)
    assert code == 130, bg.text
    assert "interrupted" in bg.text
    assert not lock_present(base_inventory, "lab1")
    assert current_release(base_inventory, "lab1", "ref") == previous
    assert current_mode(base_inventory, "lab1", "ref") == MODE
    status = opsctl("status", "-i", str(base_inventory), "--host", "lab1", "--json")
    assert status.returncode == 0, status.stderr


def test_second_concurrent_deploy_refuses_then_waits(base_inventory: Path) -> None:
    first = background("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE, "--force")
    try:
        first.wait_for("lab1/ref: staging", timeout=120)
        second = opsctl("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE, "--force")
        assert second.returncode == 1
        # the result line names host, service and outcome once: `lab1/ref: locked deploy lock held by ...`
        assert "lab1/ref: locked deploy lock held by" in second.stderr and "--lock-wait" in second.stderr, second.stderr
        waiting = opsctl("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE, "--lock-wait", "600")
    finally:  # the next test needs lab1's lock free: never leave the first deploy running
        first_code = first.finish()
    assert first_code == 0, first.text
    assert waiting.returncode == 0, waiting.stderr[-3000:]
    assert "lab1/ref: unchanged" in waiting.stderr  # it waited for the first, then found nothing to do
    assert not lock_present(base_inventory, "lab1")


def test_host_down_mid_gate_leaves_no_untested_release(base_inventory: Path, lab_config: LabConfig) -> None:
    """lab2 goes down (a power cut) while its new release is in the health gate: the other host's deploy
    stands, lab2's is unreachable. Guards against: the untested release stayed `current` unmarked after the reboot, the
    same deploy called it "unchanged", status exited 0, rollback skipped the smoke gate. Now status fails and
    says so, the same deploy (no --force) runs its gates, and a rollback goes to a release that passed them,
    smoke-tested."""
    from opsctl.lab import start_host, stop_host

    inv = str(base_inventory)
    previous = current_release(base_inventory, "lab2", "ref")
    # the new server on lab2 stays in its loading phase (a runtime drop-in: gone with the reboot)
    with loading_held(base_inventory, "lab2", "opsctl-ref.service"):
        bg = background("deploy", "-i", inv, "--mode", MODE, "--force", "--max-fail", "1")
        bg.wait_for("lab2/ref: restarted in", timeout=600)
        stop_host(lab_config, "lab2", kill=True)
        try:
            code = bg.finish(timeout=600)
        finally:
            start_host(lab_config, "lab2")
    assert code == 1, bg.text
    assert "lab1/ref: deployed" in bg.text, bg.text
    assert "lab2/ref: unreachable" in bg.text, bg.text
    untested = current_release(base_inventory, "lab2", "ref")
    assert untested != previous
    # lab2 rebooted: its deploy lock (under /run) is gone; /dev/shm is empty, so the models come back through
    # provision (until then the unit crash-loops)
    assert not lock_present(base_inventory, "lab2")
    restored = provision(base_inventory, "--host", "lab2", always=True)
    assert restored.returncode == 0, restored.stderr[-3000:]
    status = opsctl("status", "-i", inv, "--host", "lab2", "--service", "ref", "--json")
    (row,) = json.loads(status.stdout)["services"]
    assert status.returncode == 1 and row["gates_pending"] and row["rollback_to"] == previous, status.stdout
    human = opsctl("status", "-i", inv, "--host", "lab2", "--service", "ref")
    assert f"lab2/ref: release {untested} went live but never finished its gates" in human.stderr, human.stderr
    again = opsctl("deploy", "-i", inv, "--host", "lab2", "--mode", MODE)  # the same configuration
    assert again.returncode == 0, again.stderr[-3000:]
    assert "unchanged" not in again.stderr and "never finished its gates: running them now" in again.stderr
    assert "smoke ok" in again.stderr and "gates finished (interrupted before)" in again.stderr, again.stderr
    assert current_release(base_inventory, "lab2", "ref") == untested
    assert opsctl("status", "-i", inv, "--host", "lab2", "--service", "ref").returncode == 0
    back = opsctl("rollback", "-i", inv, "--host", "lab2", "ref")
    assert back.returncode == 0, back.stderr[-3000:]
    assert f"rolled back to {previous} (healthy)" in back.stderr and "smoke ok" in back.stderr, back.stderr
    assert current_release(base_inventory, "lab2", "ref") == previous


def test_logs_follow_stops_cleanly_on_ctrl_c(base_inventory: Path) -> None:
    from opsctl.commands import sh
    from tests.lab.deploy_support import remote_run

    bg = background("logs", "-i", str(base_inventory), "ref", "--host", "lab1", "-f", "-n", "1", stdout_lines=True)
    # following: its first round printed the last line (a wait on its output: a loaded machine only slows it)
    bg.wait_for_stdout(lambda out: any(ln.startswith("lab1/ref | ") for ln in out), "the first journal line", 180)
    before = len(bg.out_lines)
    with polling(_health_url(base_inventory, "lab1")):  # new /health lines in the journal while following
        bg.wait_for_stdout(lambda out: any("GET /health" in ln for ln in out[before:]), "a new /health line", 180)
    bg.proc.send_signal(signal.SIGINT)
    assert bg.finish(timeout=30) == 0
    assert "lab1/ref | " in bg.stdout and "GET /health" in bg.stdout
    assert remote_run(base_inventory, "lab1", sh("pgrep -c journalctl || true")).strip() in ("", "0")


def _get_status(url: str, key: str | None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)


def test_api_key_rotation_is_deployed_and_never_leaks(base_inventory: Path, tmp_path: Path) -> None:
    import secrets
    from datetime import datetime, timedelta

    from opsctl.commands import Cmd, sh
    from tests.lab.deploy_support import remote_run

    keyed = variant(base_inventory, tmp_path, lambda d: service(d, "lab1").update(api_key="env:OPSCTL_LAB_KEY"))
    models_url = _health_url(base_inventory, "lab1").replace("/health", "/v1/models")
    old_key, new_key = f"lab-old-{secrets.token_hex(8)}", f"lab-new-{secrets.token_hex(8)}"
    outputs: list[str] = []

    def deploy(key: str) -> str:
        result = opsctl("deploy", "-i", str(keyed), "--host", "lab1", "--mode", MODE, env={"OPSCTL_LAB_KEY": key})
        outputs.extend([result.stdout, result.stderr])
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stderr

    base_release = current_release(base_inventory, "lab1", "ref")
    deploy(old_key)
    first = current_release(base_inventory, "lab1", "ref")
    assert (_get_status(models_url, None), _get_status(models_url, old_key)) == (401, 200)

    # Five failed releases newer than the good ones (as five bad deploys leave): pruning must not count them.
    stamp = datetime.strptime(first[:16], "%Y%m%dT%H%M%SZ")
    bad = [f"{(stamp + timedelta(seconds=i)).strftime('%Y%m%dT%H%M%SZ')}-{i:012x}" for i in range(1, 6)]
    dirs = " ".join(f"/opt/opsctl/services/ref/releases/{b}" for b in bad)
    remote_run(
        base_inventory,
        "lab1",
        sh(f"for d in {dirs}; do mkdir -p $d && echo {{}} > $d/manifest.json && echo failed > $d/BAD; done", sudo=True),
    )
    rotated = deploy(new_key)  # same inventory, new value behind env:OPSCTL_LAB_KEY, no --force
    second = current_release(base_inventory, "lab1", "ref")
    left = remote_run(base_inventory, "lab1", Cmd.of("ls", "/opt/opsctl/services/ref/releases")).split()
    assert base_release in left and first in left and not set(bad) & set(left), left
    assert "API key changed" in rotated and second != first and second[-12:] == first[-12:]
    assert (_get_status(models_url, old_key), _get_status(models_url, new_key)) == (401, 200)
    assert "lab1/ref: unchanged" in deploy(new_key)
    # Rolling back would serve the rotated-away key again: refused unless asked for.
    back = opsctl("rollback", "-i", str(keyed), "--host", "lab1", "ref", env={"OPSCTL_LAB_KEY": new_key})
    outputs.extend([back.stdout, back.stderr])
    assert back.returncode == 1 and "different API key" in back.stderr and "--allow-old-secrets" in back.stderr
    assert current_release(base_inventory, "lab1", "ref") == second
    assert (_get_status(models_url, old_key), _get_status(models_url, new_key)) == (401, 200)

    journal = remote_run(base_inventory, "lab1", sh("journalctl --no-pager -o cat -n 20000", sudo=True))
    argv = remote_run(base_inventory, "lab1", sh("ps -eo args; systemctl show -p ExecStart opsctl-ref.service"))
    for key in (old_key, new_key):
        assert not any(key in text for text in (*outputs, journal, argv))

    restore = opsctl("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE)
    assert restore.returncode == 0, restore.stderr[-3000:]


def test_models_missing_after_reboot_stop_the_deploy(base_inventory: Path) -> None:
    import yaml

    from opsctl.commands import Cmd
    from tests.lab.deploy_support import remote_run

    model = yaml.safe_load(base_inventory.read_text())["hosts"]["lab1"]["services"]["ref"]["model"]["path"]
    before = current_release(base_inventory, "lab1", "ref")
    remote_run(base_inventory, "lab1", Cmd.of("mv", "--", model, model + ".away", sudo=True))
    try:
        result = opsctl("deploy", "-i", str(base_inventory), "--host", "lab1", "--mode", MODE, "--force")
        status = opsctl("status", "-i", str(base_inventory), "--host", "lab1", "--service", "ref", "--json")
        human = opsctl("status", "-i", str(base_inventory), "--host", "lab1", "--service", "ref")
    finally:
        remote_run(base_inventory, "lab1", Cmd.of("mv", "--", model + ".away", model, sudo=True))
    # still serving (the model is in memory), but the next restart would fail: status says so and exits 1
    assert status.returncode == 1, status.stderr
    (row,) = json.loads(status.stdout)["services"]
    assert row["missing_models"] == [model] and row["healthy"] is True
    assert f"model {model} not on the host" in human.stderr and "opsctl provision" in human.stderr
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"model {model} not on the host" in result.stderr and "opsctl provision" in result.stderr
    assert "Traceback" not in result.stderr
    assert current_release(base_inventory, "lab1", "ref") == before
    assert unit_props(base_inventory, "lab1", "opsctl-ref.service")["ActiveState"] == "active"
