"""Model integrity facts (opsctl.facts.modelcheck) and the boot-time restore units (opsctl.ops.model_restore): pure
parsers and decisions, on recorded output."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

import pytest

from opsctl.deploy import guards, secret_fp
from opsctl.deploy.lock import LockInfo
from opsctl.facts import modelcheck, trust
from opsctl.facts.manifest import FileEntry, Manifest
from opsctl.inventory.model import ModelSourceKind, ModelSpec
from opsctl.ops import model_restore, model_trust
from opsctl.ops.base import KeepLocal, PutText
from opsctl.systemd import exec_argv, parse_unit

SHA_A, SHA_B = "a" * 64, "b" * 64
MANIFEST = Manifest({"config.json": FileEntry(10, SHA_A), "model.safetensors": FileEntry(1000, SHA_B)})
ONE_LINE = MANIFEST.to_json().replace("\n", "")
# Recorded from a lab host (systemctl 252, find -printf): the unit started at 05:30:00.5 UTC.
STARTED = "Tue 2026-12-01 05:30:00.500000 UTC"
T_START = datetime(2026, 12, 1, 5, 30, 0, 500000, tzinfo=UTC).timestamp()


def _output(ctime_weights: float, size_weights: int = 1000, start: str = STARTED) -> str:
    return "\n".join(
        [
            f"start {start}",
            "model 1 /dev/shm/m",
            f"manifest {ONE_LINE}",
            f"file 10 {T_START - 100:.10f} config.json",
            f"file {size_weights} {ctime_weights:.10f} model.safetensors",
            "model 0 /dev/shm/draft",
            "garbage",
        ]
    )


def test_parse_state_reads_start_models_and_files() -> None:
    started, models = modelcheck.parse_state(_output(T_START - 50))
    assert started == pytest.approx(T_START)
    assert [m.path for m in models] == ["/dev/shm/m", "/dev/shm/draft"]
    assert models[0].manifest == MANIFEST and models[0].files["model.safetensors"].size == 1000
    assert not models[1].exists


def test_judge_each_problem() -> None:
    started, (fine, draft) = modelcheck.parse_state(_output(T_START - 50))
    assert modelcheck.judge(fine, started).problem is None
    assert modelcheck.judge(draft, started).problem is modelcheck.Problem.MISSING
    # written after the service started, same size: the process still maps the old file
    _, (changed, _) = modelcheck.parse_state(_output(T_START + 3))
    verdict = modelcheck.judge(changed, started)
    assert verdict.problem is modelcheck.Problem.CHANGED and "model.safetensors" in verdict.detail
    # a different size is damage, whenever it happened
    _, (damaged, _) = modelcheck.parse_state(_output(T_START - 50, size_weights=999))
    assert modelcheck.judge(damaged, started).problem is modelcheck.Problem.DAMAGED
    # never started (unit inactive): nothing can have changed under it
    assert modelcheck.judge(changed, None).problem is None


def test_judge_deep_catches_same_size_corruption() -> None:
    started, (fine, _) = modelcheck.parse_state(_output(T_START - 50))
    hashed = {"config.json": FileEntry(10, SHA_A), "model.safetensors": FileEntry(1000, "c" * 64)}
    deep = modelcheck.ModelFacts(fine.path, True, fine.manifest, fine.files, hashed)
    verdict = modelcheck.judge(deep, started)
    assert verdict.problem is modelcheck.Problem.DAMAGED and "model.safetensors" in verdict.detail


def test_no_manifest_is_shown_but_not_a_failure() -> None:
    facts = modelcheck.ModelFacts("/dev/shm/m", True, None, {"x": modelcheck.ModelFile(1, T_START - 1)})
    verdict = modelcheck.judge(facts, T_START)
    assert verdict.problem is modelcheck.Problem.NO_MANIFEST and verdict.ok


def test_parse_start_formats() -> None:
    assert modelcheck.parse_start("") is None and modelcheck.parse_start("n/a") is None
    assert modelcheck.parse_start("Tue 2026-12-01 05:30:00 UTC") == pytest.approx(T_START - 0.5)


def test_hints_name_one_command() -> None:
    changed = modelcheck.ModelVerdict("/dev/shm/m", modelcheck.Problem.CHANGED, "x written after")
    assert "`opsctl provision -i INVENTORY --host h1`" in modelcheck.fix_hint(changed, "h1", "ref")
    missing = modelcheck.ModelVerdict("/dev/shm/m", modelcheck.Problem.MISSING)
    assert "systemctl start opsctl-model-m.service" in modelcheck.fix_hint(
        missing, "h1", "ref", "opsctl-model-m.service"
    )
    assert "then deploy" not in modelcheck.fix_hint(missing, "h1", "ref")  # provision alone restores and restarts


SPEC = ModelSpec("/srv/models/Qwen3 6", ModelSourceKind.HOST, "/dev/shm/Qwen3.6-27B", False)


def test_restore_unit_orders_before_and_is_required_by_its_services() -> None:
    text = model_restore.unit_text(SPEC, ["opsctl-gpu0.service", "opsctl-gpu1.service"])
    directives = {(d.section, d.key): d.value for d in parse_unit(text)}
    assert directives["Unit", "Before"] == "opsctl-gpu0.service opsctl-gpu1.service"
    assert directives["Install", "RequiredBy"] == "opsctl-gpu0.service opsctl-gpu1.service"
    assert directives["Service", "Type"] == "oneshot" and directives["Service", "RemainAfterExit"] == "yes"
    assert exec_argv(directives["Service", "ExecStart"]) == (
        model_restore.SCRIPT, "/srv/models/Qwen3 6", "/dev/shm/Qwen3.6-27B", "/var/lib/opsctl/models/Qwen3.6-27B",
    )  # fmt: skip
    assert modelcheck.restore_unit(SPEC) == "opsctl-model-Qwen3.6-27B.service"


def test_restore_plan_writes_only_what_differs() -> None:
    services = ["opsctl-gpu0.service"]
    wanted = model_restore.desired_files(SPEC, MANIFEST, services)
    have = {path: text for path, (text, _) in wanted.items()}
    assert model_restore.plan_restore(SPEC, MANIFEST, services, have, enabled=True)[0] == []
    have["/var/lib/opsctl/models/Qwen3.6-27B/sha256sums"] = "stale"
    actions, _ = model_restore.plan_restore(SPEC, MANIFEST, services, have, enabled=True)
    writes = [a for a in actions if isinstance(a, PutText)]
    assert [w.remote for w in writes] == ["/var/lib/opsctl/models/Qwen3.6-27B/sha256sums"]
    assert writes[0].text == f"{SHA_A}  config.json\n{SHA_B}  model.safetensors\n"
    assert actions[-1].display() == "systemctl reenable --quiet -- opsctl-model-Qwen3.6-27B.service"
    assert model_restore.plan_restore(SPEC, None, services, {}, enabled=False)[0] == []  # no manifest yet


def test_rollback_secrets_rule() -> None:
    now = {"api_key": "new"}
    assert not guards.secrets_differ(secret_fp.fingerprint(now), now)
    assert guards.secrets_differ(secret_fp.fingerprint({"api_key": "old"}), now)
    assert guards.secrets_differ(None, now)  # deployed before fingerprints, or without a key
    assert guards.secrets_differ(secret_fp.fingerprint({"api_key": "old"}), {})  # it would serve a key again
    assert not guards.secrets_differ(None, {})


def test_bounded_error_text() -> None:
    assert guards.bounded("a\n  b") == "a b"
    long = "pip install failed: " + "x" * 21000 + " No space left on device"
    cut = guards.bounded(long)
    assert len(cut) <= guards.ERROR_TEXT_MAX and cut.startswith("pip install") and cut.endswith("left on device")


def test_lock_holder_gone_only_when_it_ran_here_and_is_dead() -> None:
    here = f"root@{socket.gethostname()}"
    alive = LockInfo("t", here, os.getpid(), "2026-12-01T05:00:00Z", "deploy ref")
    assert alive.holder_gone() is False
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process
    dead = LockInfo("t", here, dead_pid, "2026-12-01T05:00:00Z", "deploy ref")
    assert dead.holder_gone() is True and "STALE" in dead.describe(datetime(2026, 12, 1, 5, 10, tzinfo=UTC))
    elsewhere = LockInfo("t", "root@other-machine", dead_pid, "2026-12-01T05:00:00Z", "deploy ref")
    assert elsewhere.holder_gone() is None and "STALE" not in elsewhere.describe(datetime.now(UTC))


def test_journal_tail_drops_health_probe_lines() -> None:
    from opsctl.logs import without_health_probes

    lines = [
        'INFO:     10.223.0.1:50312 - "GET /health HTTP/1.1" 200 OK',
        "Traceback (most recent call last):",
        '[2026-12-01 05:30:00] INFO:     127.0.0.1:1 - "GET /health_generate HTTP/1.1" 503 Service Unavailable',
        'INFO:     10.223.0.1:50313 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "RuntimeError: CUDA out of memory",
    ]
    assert without_health_probes(lines) == [lines[1], lines[3], lines[4]]


def test_provision_restarts_a_service_whose_good_model_changed_after_it_started(monkeypatch) -> None:
    # A repair that the running process never saw (an earlier provision, or by hand): the model matches its
    # manifest, so nothing is copied, yet the unit must restart. Before the fix the plan had no action at all.
    from pathlib import Path

    from opsctl.commands import Cmd
    from opsctl.inventory.load import load_inventory
    from opsctl.ops.base import Context
    from opsctl.ops.model_sync import ModelSync
    from opsctl.remote.fake import FakeHost

    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(Path(__file__).parent / "golden" / "inventory.yaml").hosts[0]
    victim = host.services[0].name
    listing = f"{SHA_A} 10 w.bin\n"
    manifest = Manifest({"w.bin": FileEntry(10, SHA_A)}).to_json()

    def handler(cmd: Cmd):
        text = cmd.display()
        if "ExecMainStartTimestamp" in text:
            changed = f"opsctl-{victim}.service" in text
            files = [f"model 1 {p}\nmanifest {manifest.replace(chr(10), '')}" for p in ("/dev/shm/Qwen3-8B",)]
            ctime = T_START + 5 if changed else T_START - 5
            return (0, f"start {STARTED}\n" + "\n".join(files) + f"\nfile 10 {ctime} w.bin\n", "")
        if "sha256sum" in text:
            return (0, listing, "")
        if text.startswith("cat ") and text.endswith(".opsctl-manifest.json"):
            return (0, manifest, "")
        if text.startswith("cat ") and text.endswith("trusted.json"):  # accepted before: nothing to record
            return (0, trust.Trusted(Manifest({"w.bin": FileEntry(10, SHA_A)}), "t", "first use").to_json(), "")
        if text.startswith("test -d") and ".opsctl-sync-" in text:
            return (1, "", "")
        if text.startswith("df "):
            return (0, "Filesystem 1-blocks Used Available Capacity Mounted on\ntmpfs 100 0 100 0% /dev/shm\n", "")
        return (0, "", "")

    remote = FakeHost(host.name, handler=handler)
    plan = ModelSync().plan(Context(host, remote))
    assert [a.display() for a in plan.actions if not isinstance(a, KeepLocal)] == [  # KeepLocal: the record's copy
        f"systemctl reset-failed -- opsctl-{victim}.service",
        f"systemctl restart -- opsctl-{victim}.service",
    ]


# --- the accepted model, and what a file written after verification means ---------------------

T_VERIFIED = T_START - 20  # provision verified the copy (wrote its manifest) before the service started


def _facts(weights_ctime: float, hashed: str | None, trusted: Manifest | None = None) -> modelcheck.ModelFacts:
    files = {
        "config.json": modelcheck.ModelFile(10, T_START - 100),
        "model.safetensors": modelcheck.ModelFile(1000, weights_ctime),
    }
    found = None if hashed is None else {"model.safetensors": FileEntry(1000, hashed)}
    return modelcheck.ModelFacts("/dev/shm/m", True, MANIFEST, files, found, T_VERIFIED, trusted)


def test_parse_state_reads_the_verification_time_and_the_accepted_model() -> None:
    record = trust.Trusted(MANIFEST, "2026-12-01T05:00:00Z", "first use").to_json().replace("\n", "")
    lines = _output(T_START + 3).replace(
        f"manifest {ONE_LINE}", f"manifest {ONE_LINE}\nverified {T_VERIFIED:.10f}\ntrusted {record}"
    )
    _, (facts, _) = modelcheck.parse_state(lines)
    assert facts.verified == pytest.approx(T_VERIFIED) and facts.trusted == MANIFEST
    assert facts.unverified == ["model.safetensors"]  # written after provision verified it: to be hashed


def test_a_file_written_in_place_after_verification_is_corrupt_not_changed() -> None:
    # A byte flipped in place: same size, newer ctime. Before the fix: CHANGED, "the running process still uses
    # the old files" (false: the server maps /dev/shm), and deploy restarted into it.
    corrupt = modelcheck.judge(_facts(T_START + 3, "c" * 64), T_START)
    assert corrupt.problem is modelcheck.Problem.DAMAGED and not corrupt.ok
    assert "model.safetensors written after provision verified it" in corrupt.detail
    assert "is corrupt" in modelcheck.describe(corrupt)
    # the same write with the right bytes (a repair): a restart loads it, and nothing claims the old files
    good = modelcheck.judge(_facts(T_START + 3, SHA_B), T_START)
    assert good.problem is modelcheck.Problem.CHANGED
    assert "still uses the old files" not in modelcheck.fix_hint(good, "h1", "ref")
    assert "match the accepted sha256" in modelcheck.fix_hint(good, "h1", "ref")


def test_the_accepted_model_is_the_reference_when_recorded() -> None:
    other = Manifest({"config.json": FileEntry(10, SHA_A), "model.safetensors": FileEntry(1000, "d" * 64)})
    # /dev/shm's manifest agrees with the bytes, but not with the model accepted on the host
    verdict = modelcheck.judge(_facts(T_START - 50, None, trusted=other), T_START)
    assert verdict.problem is modelcheck.Problem.DAMAGED and "not the model accepted" in verdict.detail
    assert modelcheck.judge(_facts(T_START - 50, None, trusted=MANIFEST), T_START).problem is None


def test_files_hash_listing_parses_coreutils_output() -> None:
    files = {"a b.bin": modelcheck.ModelFile(5, 0.0), "c.bin": modelcheck.ModelFile(7, 0.0)}
    out = f"{SHA_A}  a b.bin\n{SHA_B}  c.bin\n\\{SHA_A}  odd\\nname\ngarbage\n"
    assert modelcheck.parse_files_hash(out, files) == {"a b.bin": FileEntry(5, SHA_A), "c.bin": FileEntry(7, SHA_B)}
    assert modelcheck.files_hash_cmd("/dev/shm/m", ["a b.bin"]).argv == (
        "sh", "-c", "cd /dev/shm/m && sha256sum -- 'a b.bin'",
    )  # fmt: skip


def test_source_verdicts_like_known_hosts() -> None:
    record = trust.Trusted(MANIFEST, "2026-12-01T05:00:00Z", "first use")
    flipped = Manifest({"config.json": FileEntry(10, SHA_A), "model.safetensors": FileEntry(1000, "e" * 64)})
    grown = Manifest({**MANIFEST.files, "NOTES.md": FileEntry(3, SHA_A)})
    judge = model_trust.judge_source
    assert judge(None, MANIFEST, accept=False).trust is model_trust.Trust.FIRST_USE
    assert judge(record, MANIFEST, accept=False).trust is model_trust.Trust.MATCHES
    refused = judge(record, flipped, accept=False)
    assert refused.trust is model_trust.Trust.REFUSED and refused.detail == "differ: model.safetensors"
    assert not refused.record and judge(record, flipped, accept=True).record
    assert judge(record, grown, accept=False).detail == "not accepted: NOTES.md"
    assert judge(record, MANIFEST, accept=False).record is False  # recorded already: nothing to write
    earlier = trust.Trusted(MANIFEST, "", "earlier manifest x", recorded=False)
    assert judge(earlier, MANIFEST, accept=False).record is True  # a host from before records: recorded now
    assert judge(earlier, flipped, accept=False).trust is model_trust.Trust.REFUSED
    assert trust.parse_trusted(record.to_json()) == record
    assert trust.parse_trusted("{") is None and trust.parse_trusted("") is None
    assert trust.digest(MANIFEST).startswith("sha256:") and len(trust.digest(MANIFEST)) == 23
    assert trust.trust_path("/dev/shm/Qwen3 6/") == "/var/lib/opsctl/models/Qwen3_6/trusted.json"


def test_accept_model_must_name_a_model_of_the_selected_hosts(monkeypatch) -> None:
    from pathlib import Path

    from opsctl.errors import ProvisionError
    from opsctl.inventory.load import load_inventory
    from opsctl.provision import accepted_models

    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    hosts = load_inventory(Path(__file__).parent / "golden" / "inventory.yaml").hosts
    assert accepted_models(hosts, ["/dev/shm/Qwen3-8B/"]) == frozenset({"/dev/shm/Qwen3-8B"})
    with pytest.raises(ProvisionError, match="--accept-model /dev/shm/typo: no selected host"):
        accepted_models(hosts, ["/dev/shm/typo"])


def test_a_host_that_lost_its_record_is_judged_against_the_control_machines_copy(monkeypatch) -> None:
    # The host's trusted.json is gone and /dev/shm's manifest describes other bytes than the model accepted
    # ("nothing anywhere remembers what the model was"): the control machine's copy still does.
    from pathlib import Path

    from opsctl.commands import Cmd
    from opsctl.inventory.load import load_inventory
    from opsctl.remote.fake import FakeHost

    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(Path(__file__).parent / "golden" / "inventory.yaml").hosts[0]
    svc = host.services[0]
    path = svc.model.path
    shm = Manifest({"w.bin": FileEntry(10, SHA_B)})

    def handler(cmd: Cmd):
        if "ExecMainStartTimestamp" in cmd.display():
            body = f"start {STARTED}\nmodel 1 {path}\nmanifest {shm.to_json().replace(chr(10), '')}\n"
            return (0, body + f"file 10 {T_START - 5} w.bin\n", "")
        return (0, "", "")

    unit = f"opsctl-{svc.name}.service"
    alone = modelcheck.check(FakeHost(host.name, handler=handler), svc, unit, host=host)
    assert [v.problem for v in alone] == [None]  # no record anywhere: /dev/shm's manifest is all there is
    accepted = trust.Trusted(Manifest({"w.bin": FileEntry(10, SHA_A)}), "2026-12-01T05:00:00Z", "first use")
    KeepLocal(trust.local_path(host, path), accepted.to_json()).write()
    kept = modelcheck.check(FakeHost(host.name, handler=handler), svc, unit, host=host)
    assert kept[0].problem is modelcheck.Problem.DAMAGED and "not the model accepted" in kept[0].detail


def test_a_failed_restore_unit_is_not_started_again() -> None:
    """After the boot-time restore unit failed (a corrupt source), status suggested `systemctl start`
    of it, which fails again; provision copies the model back or says what is wrong with the source."""
    from opsctl import status
    from opsctl.inventory.model import DDTreeKnobs, Engine, Host, Mode, Service, SshConfig
    from opsctl.remote.fake import FakeHost

    missing = modelcheck.ModelVerdict(SPEC.path, modelcheck.Problem.MISSING)
    hint = modelcheck.fix_hint(missing, "h1", "ref", "opsctl-model-x.service", "exit-code")
    assert "systemctl start" not in hint
    assert hint.startswith("its restore unit opsctl-model-x.service failed (exit-code; `journalctl -b -u ")
    assert "`opsctl provision -i INVENTORY --host h1` copies it back, or refuses a source" in hint
    svc = Service("ref", "h1", (), 30000, Mode.BASELINE, Engine.REFERENCE, SPEC, None, DDTreeKnobs())
    host = Host("h1", "10.0.0.1", SshConfig(), 0, "/v", "python3", "0.5.23", None, None, (svc,))
    unit = modelcheck.restore_unit(SPEC)
    for shown, failed in (("ActiveState=failed\nSubState=failed\nResult=exit-code\n", True),
                          ("ActiveState=inactive\nSubState=dead\nResult=success\n", False)):  # fmt: skip
        fake = FakeHost("h1", handler=lambda cmd, shown=shown: (0, shown, "") if unit in cmd.display() else None)
        found = status._failed_restores(fake, svc, [missing])
        assert found == ({unit: "exit-code"} if failed else {})
        line = status._model_line(missing, host, svc, found)
        assert ("systemctl start" in line) is not failed and line.startswith(f"model {SPEC.path} not on the host")
