"""Deploy faults on lab hosts, each fault injected for real: a model changed under a running service, a host
rebooted (the container stopped and booted again: /dev/shm and /run start empty), Ctrl-C during the
pre-flight, a deploy lock whose holder is dead, an abandoned release. Lean: one shared lab, no deploy that a
check does not need."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.commands import Cmd, sh
from opsctl.lab import LabConfig
from tests.lab.deploy_support import (
    MODE,
    background,
    current_release,
    derived_inventory,
    is_bad,
    opsctl,
    provision,
    provisioned_and_deployed,
    remote_run,
    service,
    tune,
    unit_props,
)

pytestmark = pytest.mark.lab

MODEL = "/dev/shm/tiny-qwen3"
DRAFT = "/dev/shm/tiny-qwen3-draft"
HOST_SRC = "/var/lib/opsctl-lab-src"  # a host-side model source (stands in for a host's NVMe copy)


@pytest.fixture(scope="module")
def base_inventory(lab_hosts, tmp_path_factory) -> Path:
    return provisioned_and_deployed(tmp_path_factory.mktemp("lifecycle") / "lab.yaml", tune)


def _url(inv: Path, host: str) -> str:
    return f"http://{yaml.safe_load(inv.read_text())['hosts'][host]['address']}:30000/health"


def _wait_healthy(url: str, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError, TimeoutError):
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy within {timeout}s")


def _health_now(url: str) -> int:
    """One GET, no retry: what a smoke run right after a command would meet."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0


def _releases(inv: Path, host: str) -> str:
    return remote_run(inv, host, sh("ls /opt/opsctl/services/ref/releases; ls /opt/opsctl/services/ref/releases/*/BAD"
                                    " 2>/dev/null || true", sudo=True))  # fmt: skip


def test_model_corrupted_in_place_is_refused_by_deploy_and_provision_repairs_and_waits(base_inventory: Path) -> None:
    inv = str(base_inventory)
    before = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    release, releases = current_release(base_inventory, "lab1", "ref"), _releases(base_inventory, "lab1")
    # Corrupt the weights in place, as a bad copy or a faulty disk would: same size, the live process maps them.
    remote_run(
        base_inventory,
        "lab1",
        sh(f"printf XXXXXXXX | dd of={MODEL}/model.safetensors bs=1 seek=4096 conv=notrunc status=none", sudo=True),
    )
    status = opsctl("status", "-i", inv, "--host", "lab1")
    assert status.returncode == 1, status.stderr
    # Written in place: the process maps the damaged bytes, so "it still uses the old files" would be false.
    assert f"model {MODEL} is corrupt" in status.stderr and "model.safetensors written after provision" in status.stderr
    assert "still uses the old files" not in status.stderr and "changed under the running service" not in status.stderr
    assert f"opsctl provision -i {inv} --host lab1" in status.stderr and "Traceback" not in status.stderr
    deep = opsctl("status", "-i", inv, "--host", "lab1", "--deep", "--json")
    (row,) = json.loads(deep.stdout)["services"]
    assert deep.returncode == 1 and row["healthy"] is True  # /health stays 200 throughout: only this sees it
    assert any(f"model {MODEL} is corrupt: it does not match its manifest" in line for line in row["models"])

    # A plain deploy refuses before restarting anything: the old process keeps answering, no release is made
    # or marked BAD (before the fix: a new release crashed loading, so did the rollback, a good config went BAD).
    refused = opsctl("deploy", "-i", inv, "--host", "lab1", "--mode", MODE)
    assert refused.returncode == 1, refused.stderr[-3000:]
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("lab1/ref: failed")]
    assert f"model {MODEL} is corrupt" in line and "nothing was changed" in line
    assert f"opsctl provision -i {inv} --host lab1" in line and "Traceback" not in refused.stderr
    assert unit_props(base_inventory, "lab1", "opsctl-ref.service") == before
    assert current_release(base_inventory, "lab1", "ref") == release
    assert _releases(base_inventory, "lab1") == releases

    repaired = provision(base_inventory, "--host", "lab1", always=True)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    # provision returns once the restarted service is healthy: an immediate request is answered
    assert _health_now(_url(base_inventory, "lab1")) == 200
    out = repaired.stdout + repaired.stderr
    assert "restart opsctl-ref.service: its model is copied anew" in out
    assert "opsctl-ref.service: healthy after" in out
    after = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    assert after["MainPID"] != before["MainPID"]
    again = opsctl("status", "-i", inv, "--host", "lab1", "--deep")
    assert again.returncode == 0, again.stderr


def _host_side(doc) -> None:
    tune(doc)
    for key, path in (("model", MODEL), ("draft_model", DRAFT)):
        service(doc, "lab2")[key].update(source=f"{HOST_SRC}/{Path(path).name}", source_on="host")


def test_reboot_heals_host_side_models_and_status_names_the_fix_for_control_side(
    base_inventory: Path, lab_config: LabConfig, tmp_path: Path
) -> None:
    from opsctl.lab import start_host, stop_host

    host_inv = derived_inventory(tmp_path / "host-side.yaml", _host_side)
    src = [f"{HOST_SRC}/{Path(p).name}" for p in (MODEL, DRAFT)]
    copy = " && ".join(
        f"rm -rf {d} && cp -a {p} {d} && rm {d}/.opsctl-manifest.json" for p, d in zip((MODEL, DRAFT), src, strict=True)
    )
    remote_run(host_inv, "lab2", sh(f"mkdir -p {HOST_SRC} && {copy}", sudo=True))
    installed = provision(host_inv, "--host", "lab2", always=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    enabled = remote_run(host_inv, "lab2", Cmd.of("systemctl", "is-enabled", "opsctl-model-tiny-qwen3.service"))
    assert enabled.strip() == "enabled"

    for name in ("lab1", "lab2"):
        stop_host(lab_config, name)  # a clean reboot: poweroff, then boot the same disk
    for name in ("lab1", "lab2"):
        start_host(lab_config, name)
    # No opsctl command: lab2's restore units copy the models back before the service starts.
    took = _wait_healthy(_url(host_inv, "lab2"), 300)
    journal = remote_run(host_inv, "lab2", sh("journalctl -b -u opsctl-model-tiny-qwen3.service -o cat", sudo=True))
    assert f"{MODEL}: restored from {HOST_SRC}/tiny-qwen3 and verified" in journal, journal
    lab2 = opsctl("status", "-i", str(host_inv), "--host", "lab2")
    assert lab2.returncode == 0, lab2.stderr
    # lab1's models live on the control machine: status says so, with the one command that fixes it.
    lab1 = opsctl("status", "-i", str(base_inventory), "--host", "lab1")
    assert lab1.returncode == 1
    assert (
        f"model {MODEL} not on the host" in lab1.stderr
        and f"opsctl provision -i {base_inventory} --host lab1" in lab1.stderr
    )
    restored = provision(base_inventory, "--host", "lab1", always=True)
    assert restored.returncode == 0, restored.stderr[-3000:]
    _wait_healthy(_url(base_inventory, "lab1"), 300)
    assert opsctl("status", "-i", str(base_inventory)).returncode == 0
    print(f"lab2 healthy {took:.0f}s after its boot, with no opsctl command")


def test_corrupt_host_source_is_refused_after_a_reboot_until_a_model_is_accepted(
    base_inventory: Path, lab_config: LabConfig, tmp_path: Path
) -> None:
    from opsctl.lab import start_host, stop_host

    inv = derived_inventory(tmp_path / "host-side.yaml", _host_side)
    src, state = f"{HOST_SRC}/tiny-qwen3", "/var/lib/opsctl/models/tiny-qwen3"
    copy = " && ".join(
        f"rm -rf {HOST_SRC}/{Path(p).name} && cp -a {p} {HOST_SRC}/{Path(p).name} && rm {HOST_SRC}/{Path(p).name}/"
        ".opsctl-manifest.json" for p in (MODEL, DRAFT)
    )  # fmt: skip
    remote_run(
        inv, "lab2", sh(f"mkdir -p {HOST_SRC} && {copy} && rm -rf {src}.good && cp -a {src} {src}.good", sudo=True)
    )
    installed = provision(inv, "--host", "lab2", always=True)  # restore units (a no-op after the reboot test)
    assert installed.returncode == 0, installed.stderr[-3000:]

    def records() -> str:
        return remote_run(inv, "lab2", sh(f"cat {state}/trusted.json {state}/manifest.json {state}/sha256sums"))

    accepted = records()
    remote_run(inv, "lab2", sh(f"printf XXXXXXXX | dd of={src}/model.safetensors bs=1 seek=4096 conv=notrunc "
                               "status=none", sudo=True))  # fmt: skip
    stop_host(lab_config, "lab2")
    start_host(lab_config, "lab2")
    failed = Cmd.of("systemctl", "is-failed", "--quiet", "opsctl-model-tiny-qwen3.service")
    deadline = time.monotonic() + 120
    while remote_run(inv, "lab2", sh(f"{failed.shell()} && echo failed || true")).strip() != "failed":
        assert time.monotonic() < deadline, "the restore unit did not fail on the corrupt source"
        time.sleep(1)

    refused = provision(inv, "--host", "lab2", always=True)
    assert refused.returncode == 1, refused.stderr[-3000:]
    text = refused.stdout + refused.stderr
    assert f"model source {src} (on the host) is not the model accepted for {MODEL}" in text, text[-3000:]
    assert "differ: model.safetensors" in text and "nothing was copied" in text and "Traceback" not in text
    assert f"--accept-model {MODEL}" in text
    assert records() == accepted  # the accepted model, the restore unit's manifest and sha256sums unchanged
    assert remote_run(inv, "lab2", sh(f"test -e {MODEL} && echo copied || echo absent")).strip() == "absent"

    # The explicit act: a new revision of the model (the good weights plus a file) accepted by name.
    remote_run(inv, "lab2", sh(f"rm -rf {src} && cp -a {src}.good {src} && echo v2 > {src}/NOTES.md", sudo=True))
    new = provision(inv, "--host", "lab2", "--accept-model", MODEL, always=True)
    assert new.returncode == 0, new.stderr[-3000:]
    assert _health_now(_url(inv, "lab2")) == 200
    trusted = json.loads(remote_run(inv, "lab2", Cmd.of("cat", f"{state}/trusted.json")))
    assert trusted["how"] == "accepted" and "NOTES.md" in trusted["files"]
    assert "NOTES.md" in remote_run(inv, "lab2", Cmd.of("cat", f"{state}/sha256sums"))
    accepted_now = opsctl("status", "-i", str(inv), "--host", "lab2", "--deep")
    assert accepted_now.returncode == 0, accepted_now.stderr  # /dev/shm, its manifest and the record agree
    # Back to the lab's model (the other modules provision lab2 from the control machine): accepted again.
    remote_run(inv, "lab2", sh(f"rm -f {src}/NOTES.md && rm -rf {src}.good", sudo=True))
    back = provision(inv, "--host", "lab2", "--accept-model", MODEL, always=True)
    assert back.returncode == 0, back.stderr[-3000:]
    assert opsctl("status", "-i", str(inv), "--host", "lab2").returncode == 0


def test_restore_unit_is_disabled_and_removed_when_the_source_moves_to_the_control_machine(
    base_inventory: Path, tmp_path: Path
) -> None:
    # lab2's restore unit installed from a host-side source (a no-op after the tests above: the sources and the
    # units are still there), then lab2 provisioned from the base inventory, whose sources are on the control
    # machine: left enabled, the unit would copy the old host-side source over the model at the next boot.
    inv = derived_inventory(tmp_path / "host-side.yaml", _host_side)
    unit, state = "opsctl-model-tiny-qwen3.service", "/var/lib/opsctl/models/tiny-qwen3"
    copy = " && ".join(
        f"(test -d {HOST_SRC}/{Path(p).name} || (cp -a {p} {HOST_SRC}/{Path(p).name} && rm "
        f"{HOST_SRC}/{Path(p).name}/.opsctl-manifest.json))" for p in (MODEL, DRAFT)
    )  # fmt: skip
    remote_run(inv, "lab2", sh(f"mkdir -p {HOST_SRC} && {copy}", sudo=True))
    installed = provision(inv, "--host", "lab2", always=True)
    assert installed.returncode == 0, installed.stderr[-3000:]

    def unit_state() -> list[str]:
        out = remote_run(inv, "lab2", sh(f"systemctl is-enabled {unit} 2>/dev/null; test -e /etc/systemd/system/"
                                          f"{unit} && echo file || echo no-file; true"))  # fmt: skip
        return out.split()

    def restore_step(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
        (host,) = json.loads(result.stdout)["hosts"]
        (step,) = [s for s in host["steps"] if s["op"] == "model_restore"]
        return step

    assert unit_state() == ["enabled", "file"]
    plan = provision(base_inventory, "--host", "lab2", "--plan", "--json", always=True)
    assert plan.returncode == 2, plan.stderr[-3000:]  # changes pending
    step = restore_step(plan)
    assert any(f"{unit}: no service here restores that model" in n for n in step["notes"]), step
    assert f"sudo systemctl disable --quiet -- {unit}" in step["commands"], step
    assert unit_state() == ["enabled", "file"]  # --plan changes nothing

    moved = provision(base_inventory, "--host", "lab2", always=True)
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert unit_state() == ["no-file"]  # neither enabled (systemd knows no such unit now) nor on disk
    # the accepted model is still remembered (trusted.json); the restore's own files went
    assert remote_run(inv, "lab2", sh(f"ls {state}")).split() == ["trusted.json"]
    assert opsctl("status", "-i", str(base_inventory), "--host", "lab2").returncode == 0
    again = restore_step(provision(base_inventory, "--host", "lab2", "--plan", "--json", always=True))
    assert again["commands"] == [] and not any(unit in n for n in again["notes"]), again


def test_ctrl_c_during_preflight_keeps_the_serving_process(base_inventory: Path) -> None:
    inv = str(base_inventory)
    before = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    release = current_release(base_inventory, "lab1", "ref")
    # An abandoned release (a host that went away mid-staging): status shows it, the next deploy marks it BAD.
    abandoned = "20200101T000000Z-000000000000"
    where = f"/opt/opsctl/services/ref/releases/{abandoned}"
    remote_run(base_inventory, "lab1", sh(f"rm -rf {where} && mkdir -p {where}", sudo=True))
    status = opsctl("status", "-i", inv, "--host", "lab1")
    assert f"incomplete release {abandoned}" in status.stderr, status.stderr

    bg = background("deploy", "-i", inv, "--host", "lab1", "--mode", MODE, "--force")
    bg.wait_for("lab1/ref: pre-flight", timeout=300)
    bg.proc.send_signal(signal.SIGINT)
    code = bg.finish(timeout=300)
    assert code == 130, bg.text
    assert "nothing switched" in bg.text
    after = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    assert after == before  # same process, same start, no restart
    assert current_release(base_inventory, "lab1", "ref") == release
    assert is_bad(base_inventory, "lab1", "ref", abandoned)
    log = remote_run(base_inventory, "lab1", sh("tail -n 5 /var/lib/opsctl/audit.log", sudo=True))
    assert "result=interrupted" in log


def test_dead_holder_lock_is_reported_stale(base_inventory: Path) -> None:
    inv = str(base_inventory)
    dead_pid = 2**22 + 4321  # above the default pid_max: no such process here
    fields = [f"holder=root@{socket.gethostname()}", f"pid={dead_pid}", "since=2026-01-01T00:00:00Z", "action=deploy"]
    holder = "\n".join(["token=0000", *fields]) + "\n"
    remote_run(base_inventory, "lab1", sh("mkdir -p /run/lock/opsctl/deploy.lock", sudo=True))
    remote_run(base_inventory, "lab1", Cmd.of("tee", "/run/lock/opsctl/deploy.lock/holder", stdin=holder, sudo=True))
    try:
        refused = opsctl("deploy", "-i", inv, "--host", "lab1", "--mode", MODE)
        status = opsctl("status", "-i", inv, "--host", "lab1")
    finally:
        cleared = opsctl("deploy", "-i", inv, "--host", "lab1", "--break-lock")
    assert refused.returncode == 1 and "lab1/ref: locked" in refused.stderr
    assert f"pid {dead_pid}" in refused.stderr and "STALE" in refused.stderr and "--break-lock" in refused.stderr
    assert "lab1: deploy lock held by" in status.stderr and "STALE" in status.stderr
    assert status.returncode == 1 and "--break-lock --host lab1" in status.stderr  # every deploy is refused
    audit = remote_run(base_inventory, "lab1", sh("tail -n 3 /var/lib/opsctl/audit.log", sudo=True))
    assert "result=locked" in audit
    assert cleared.returncode == 0 and "lock cleared" in cleared.stderr


def test_equivalence_finishes_the_others_when_one_service_errors(base_inventory: Path, tmp_path: Path) -> None:
    def with_ghost(doc):
        tune(doc)
        ref = service(doc, "lab1")
        # listed first and never deployed: connection refused before the real service is compared
        doc["hosts"]["lab1"]["services"] = {"ghost": {**ref, "port": 30001}, "ref": ref}

    inv = derived_inventory(tmp_path / "ghost.yaml", with_ghost)
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(yaml.safe_dump({"prompts": [{"id": "count", "prompt": "count from 1 to 5", "max_tokens": 8}]}))
    eq = opsctl(
        "smoke", "-i", str(inv), "--host", "lab1", "--equivalence", "--baseline", "lab2/ref",
        "--prompts", str(prompts), "--json",
    )  # fmt: skip
    assert eq.returncode == 1, eq.stderr
    reports = {r["service"]: r for r in json.loads(eq.stdout)}
    assert reports["lab1/ghost"]["error"] and not reports["lab1/ghost"]["passed"]
    assert reports["lab1/ref"]["passed"] and reports["lab1/ref"]["error"] is None, reports
    assert "lab1/ghost: ERROR" in eq.stderr and "Traceback" not in eq.stderr


def test_disk_full_is_refused_before_staging_in_one_line(base_inventory: Path) -> None:
    inv = str(base_inventory)
    rel = "/opt/opsctl/services/ref/releases"
    before = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    # A full disk under the releases: a small tmpfs over them (the releases copied in), filled to the last MiB.
    fill = (
        f"set -e; rm -rf /run/opsctl-rel && cp -a {rel} /run/opsctl-rel && mount -t tmpfs -o size=32m tmpfs {rel} "
        f"&& cp -a /run/opsctl-rel/. {rel}/ && rm -rf /run/opsctl-rel "
        f"&& (dd if=/dev/zero of={rel}/.filler bs=1M status=none || true)"
    )
    remote_run(base_inventory, "lab1", sh(fill, sudo=True))
    try:
        listed = remote_run(base_inventory, "lab1", Cmd.of("ls", rel))
        result = opsctl("deploy", "-i", inv, "--host", "lab1", "--mode", MODE, "--force")
        after_ls = remote_run(base_inventory, "lab1", Cmd.of("ls", rel))
    finally:
        remote_run(base_inventory, "lab1", Cmd.of("umount", rel, sudo=True))
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("lab1/ref: failed")]
    assert len(line) < 600 and "free in" in line and "free space on" in line and "nothing was changed" in line, line
    assert after_ls == listed  # no partial release left behind
    assert unit_props(base_inventory, "lab1", "opsctl-ref.service") == before


def test_bad_flag_value_is_refused_by_plan_and_deploy_before_the_switch(base_inventory: Path, tmp_path: Path) -> None:
    def bad_value(doc):
        tune(doc)
        service(doc, "lab1")["extra_args"] = ["--decode-log-interval", "0"]  # a known flag, a value it refuses

    inv = str(derived_inventory(tmp_path / "bad-value.yaml", bad_value))
    before = unit_props(base_inventory, "lab1", "opsctl-ref.service")
    release = current_release(base_inventory, "lab1", "ref")
    plan = opsctl("deploy", "-i", inv, "--host", "lab1", "--mode", MODE, "--plan")
    assert plan.returncode == 1 and "pre-flight would refuse" in plan.stderr, plan.stderr[-2000:]
    result = opsctl("deploy", "-i", inv, "--host", "lab1", "--mode", MODE)
    assert result.returncode == 1 and "nothing switched" in result.stderr, result.stderr[-3000:]
    assert "--decode-log-interval 0: must be >= 1" in result.stderr
    assert unit_props(base_inventory, "lab1", "opsctl-ref.service") == before  # never restarted: no outage
    assert current_release(base_inventory, "lab1", "ref") == release
