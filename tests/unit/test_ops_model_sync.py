"""model_sync: exact plans from facts, and the whole copy protocol run for real through LocalHost on tmp dirs
(the lab tier repeats it over SSH)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from opsctl.commands import Cmd
from opsctl.errors import ManifestMismatchError, ModelNotTrustedError, ProvisionError, RemoteError, ShmTooSmallError
from opsctl.facts import trust
from opsctl.facts.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    _coreutils_listing,
    build_local_manifest,
    hash_listing_cmd,
    parse_hash_listing,
    size_listing_cmd,
)
from opsctl.facts.system import DiskSpace
from opsctl.inventory.model import (
    DDTreeKnobs,
    Engine,
    Host,
    Mode,
    ModelSourceKind,
    ModelSpec,
    Service,
    SshConfig,
)
from opsctl.kernel.hashing import sha256_file
from opsctl.ops.base import Artifacts, Context, Options, Plan, Push, Verify
from opsctl.ops.model_sync import ModelFacts, ModelPaths, ModelSync, disk_full, models_of, plan_model
from opsctl.remote.fake import FakeHost
from opsctl.remote.local import LocalHost
from opsctl.remote.rsync import rsync_error, split_progress
from opsctl.remote.ssh import SshHost

A, B, C = "a" * 64, "b" * 64, "c" * 64
MANIFEST = Manifest({"config.json": FileEntry(100, A), "model.safetensors": FileEntry(1000, B)})
SPEC = ModelSpec("/models/m", ModelSourceKind.CONTROL, "/dev/shm/m", hybrid=False)
ROOMY = DiskSpace("/dev/shm", 10**9, 0, 10**9)
SWAP = (
    "sh -c 'set -e; if [ -e /dev/shm/m ]; then mv -T /dev/shm/m /dev/shm/.opsctl-old-m; fi; "
    "mv -T /dev/shm/.opsctl-sync-m /dev/shm/m; rm -rf /dev/shm/.opsctl-old-m; "
    "touch -- /dev/shm/m/.opsctl-manifest.json'"
)


def facts(final: dict[str, FileEntry] | None, staging: dict[str, FileEntry] | None = None, **kw: object) -> ModelFacts:
    return ModelFacts(
        final_exists=final is not None,
        final=final or {},
        stored_manifest=kw.get("stored"),  # type: ignore[arg-type]
        staging=staging or {},
        staging_exists=staging is not None,
        space=kw.get("space", ROOMY),  # type: ignore[arg-type]
    )


def displays(actions: list[object]) -> list[str]:
    out = []
    for a in actions:
        out.append(("sudo " if a.sudo else "") + a.display() if isinstance(a, Cmd) else a.display())  # type: ignore[attr-defined]
    return out


def test_paths() -> None:
    assert ModelPaths.of("/dev/shm/Qwen3.6-27B/") == ModelPaths(
        "/dev/shm/Qwen3.6-27B",
        "/dev/shm/.opsctl-sync-Qwen3.6-27B",
        "/dev/shm/.opsctl-old-Qwen3.6-27B",
    )


def test_absent_model_is_staged_verified_and_renamed() -> None:
    """A manifest hashed from this source here: the copy is proven by sizes, rsync's checksum and the source's
    stamps, not by re-reading it on the host."""
    stamped = Manifest(MANIFEST.files, {"config.json": (100, 1, 7), "model.safetensors": (1000, 2, 8)})
    actions, notes = plan_model(SPEC, stamped, facts(None))
    assert displays(actions) == [
        "rm -rf /dev/shm/.opsctl-old-m",
        "mkdir -p /dev/shm/.opsctl-sync-m",
        "verify room for 1.1 KiB in /dev/shm: df -P -B1 /dev/shm",
        "push /models/m -> /dev/shm/.opsctl-sync-m",
        "verify 2 files: sizes in /dev/shm/.opsctl-sync-m as in the manifest, and /models/m unchanged since it "
        "was hashed (rsync checked every byte it wrote against what its sender read)",
        f"write /dev/shm/.opsctl-sync-m/{MANIFEST_NAME} ({len(MANIFEST.to_json())} bytes, mode 644)",
        SWAP,
    ]
    verify = actions[4]
    assert isinstance(verify, Verify)
    assert verify.cmd == size_listing_cmd("/dev/shm/.opsctl-sync-m")
    with pytest.raises(ManifestMismatchError, match=r"does not match the source manifest: model\.safetensors"):
        verify.judge(0, "100 config.json\n999 model.safetensors\n", "")
    with pytest.raises(ManifestMismatchError, match=r"does not match the source manifest: extra\.bin"):
        verify.judge(0, "100 config.json\n1000 model.safetensors\n5 extra.bin\n", "")
    assert notes == ["/dev/shm/m: absent; copy 2 files, 1.1 KiB (1.1 KiB to transfer)"]


def test_manifest_without_stamps_hashes_the_copy() -> None:
    """A manifest not built from this source on this machine cannot vouch for what rsync sent: hash the copy."""
    actions, _ = plan_model(SPEC, MANIFEST, facts(None))
    assert isinstance(actions[3], Push)
    verify = actions[4]
    assert isinstance(verify, Verify)
    assert verify.cmd == hash_listing_cmd("/dev/shm/.opsctl-sync-m")
    verify.judge(0, f"{A} 100 config.json\n{B} 1000 model.safetensors\n", "")  # matches: no error
    with pytest.raises(ManifestMismatchError, match=r"does not match the source manifest: model\.safetensors"):
        verify.judge(0, f"{A} 100 config.json\n{C} 1000 model.safetensors\n", "")


def test_matching_model_with_manifest_is_unchanged() -> None:
    actions, notes = plan_model(SPEC, MANIFEST, facts(dict(MANIFEST.files), stored=MANIFEST))
    assert actions == []
    assert notes == ["/dev/shm/m: 2 files, 1.1 KiB, manifest verified"]


def test_matching_model_without_manifest_only_writes_it() -> None:
    actions, _ = plan_model(SPEC, MANIFEST, facts(dict(MANIFEST.files), stored=None))
    assert displays(actions) == [f"write /dev/shm/m/{MANIFEST_NAME} ({len(MANIFEST.to_json())} bytes, mode 644)"]


def test_corrupted_file_is_recopied_good_files_are_hard_linked() -> None:
    final = {"config.json": FileEntry(100, A), "model.safetensors": FileEntry(1000, C)}
    actions, notes = plan_model(SPEC, MANIFEST, facts(final, stored=MANIFEST))
    assert displays(actions)[:4] == [
        "rm -rf /dev/shm/.opsctl-old-m",
        "mkdir -p /dev/shm/.opsctl-sync-m",
        "sh -c 'cd /dev/shm/m && cp -alf --parents -t /dev/shm/.opsctl-sync-m -- config.json'",
        "verify room for 1000 B in /dev/shm: df -P -B1 /dev/shm",
    ]
    assert displays(actions)[-1] == SWAP
    assert notes == ["/dev/shm/m: 1 corrupted or changed (model.safetensors); re-copy (1000 B to transfer)"]


def test_leftover_staging_is_reused_and_its_bad_files_dropped() -> None:
    staging = {"model.safetensors": FileEntry(1000, B), "junk.tmp": FileEntry(5, C), "config.json": FileEntry(1, C)}
    actions, _ = plan_model(SPEC, MANIFEST, facts(None, staging))
    assert displays(actions)[2] == "rm -f -- /dev/shm/.opsctl-sync-m/config.json /dev/shm/.opsctl-sync-m/junk.tmp"


def test_too_small_shm_is_refused_with_the_numbers() -> None:
    small = DiskSpace("/dev/shm", 2000, 1500, 500)
    with pytest.raises(ShmTooSmallError) as info:
        plan_model(SPEC, MANIFEST, facts(None, space=small))
    assert info.value.message == (
        "/dev/shm on the host is full: 1.1 KiB needed, 500 B free (m: 1100 bytes to copy of 1.1 KiB, 500 bytes "
        "free); nothing was copied"
    )
    with pytest.raises(ShmTooSmallError, match=r"^/dev/shm on lab2 is full: 1\.1 KiB needed, 500 B free \("):
        plan_model(SPEC, MANIFEST, facts(None, space=small), "lab2")
    # the bytes already good (at the final path or staged) do not count
    final = {"model.safetensors": FileEntry(1000, B)}
    actions, _ = plan_model(SPEC, MANIFEST, facts(final, space=small))
    assert actions


def test_host_source_copies_with_rsync_on_the_host() -> None:
    spec = ModelSpec("/nvme/m", ModelSourceKind.HOST, "/dev/shm/m", hybrid=False)
    actions, _ = plan_model(spec, MANIFEST, facts(None))
    assert displays(actions)[3] == "rsync -a /nvme/m/ /dev/shm/.opsctl-sync-m/"


def test_models_deduplicated_by_destination() -> None:
    target = ModelSpec("/t", ModelSourceKind.CONTROL, "/dev/shm/t", hybrid=False)
    draft = ModelSpec("/d", ModelSourceKind.CONTROL, "/dev/shm/d", hybrid=False)
    svcs = tuple(
        Service(n, "h", (i,), 30000 + i, Mode.TREE, Engine.SGLANG, target, draft, DDTreeKnobs())
        for i, n in enumerate("ab")
    )
    h = Host("h", "x", SshConfig(), 2, "/v", "python3", "0.5.23", None, None, svcs)
    assert models_of(h) == [target, draft]


# --- the protocol for real, on the control machine -------------------------------------------------------


@pytest.fixture(autouse=True)
def _trust_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The accepted-model records under the test's own dir, never the machine's /var/lib/opsctl."""
    root = tmp_path / "trust"
    monkeypatch.setattr(trust, "STATE_ROOT", str(root))
    return root


def _model(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _ctx(tmp_path: Path, source: Path) -> tuple[Context, Path]:
    dest = tmp_path / "shm" / "model"
    dest.parent.mkdir(exist_ok=True)
    spec = ModelSpec(str(source), ModelSourceKind.CONTROL, str(dest), hybrid=False)
    svc = Service("s", "local", (), 30000, Mode.BASELINE, Engine.REFERENCE, spec, None, DDTreeKnobs())
    host = Host("local", "127.0.0.1", SshConfig(), 0, "/v", "python3", "0.5.23", None, None, (svc,))
    manifest = build_local_manifest(source)
    return Context(host, LocalHost(), artifacts=Artifacts(manifests={str(source): manifest})), dest


def _converge(ctx: Context) -> list[str]:
    op = ModelSync()
    plan = op.plan(ctx)
    op.apply(ctx, plan)
    return plan.commands()


def test_local_copy_then_no_op_then_corruption_repaired(tmp_path: Path) -> None:
    source = _model(tmp_path / "src", {"config.json": b"{}", "w/model.safetensors": os.urandom(300_000)})
    ctx, dest = _ctx(tmp_path, source)
    assert _converge(ctx)  # first run copies
    assert sha256_file(dest / "w" / "model.safetensors") == sha256_file(source / "w" / "model.safetensors")
    stored = json.loads((dest / MANIFEST_NAME).read_text())
    assert stored["files"]["config.json"]["size"] == 2
    assert ModelSync().plan(ctx).actions == ()  # second run: nothing
    # corrupt one byte, keep size and mtime: only the manifest check can see it
    weights = dest / "w" / "model.safetensors"
    st = weights.stat()
    with weights.open("r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    config_inode = (dest / "config.json").stat().st_ino
    plan = ModelSync().plan(ctx)
    assert "1 corrupted or changed (w/model.safetensors)" in plan.notes[0]
    ModelSync().apply(ctx, plan)
    assert sha256_file(dest / "w" / "model.safetensors") == sha256_file(source / "w" / "model.safetensors")
    assert (dest / "config.json").stat().st_ino == config_inode  # the good file was hard-linked, not copied
    assert ModelSync().plan(ctx).actions == ()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model"]  # no staging or old dir left


def test_failed_verification_never_touches_the_final_path(tmp_path: Path) -> None:
    source = _model(tmp_path / "src", {"a.bin": b"A" * 1000})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)
    # a manifest that does not describe the source (no stamps: the copy is hashed) cannot be satisfied
    (source / "a.bin").write_bytes(b"B" * 1000)
    new = Options(accept_models=frozenset({str(dest)}))  # a new model, accepted: the copy protocol is tested
    stale = Context(ctx.spec, ctx.remote, new, artifacts=Artifacts(manifests={str(source): Manifest(
        {"a.bin": FileEntry(1000, "0" * 64)})}))  # fmt: skip
    op = ModelSync()
    with pytest.raises(ManifestMismatchError, match="does not match the source manifest"):
        op.apply(stale, op.plan(stale))
    assert (dest / "a.bin").read_bytes() == b"A" * 1000  # the old, complete model is still in place


def test_source_changed_during_the_copy_is_refused(tmp_path: Path) -> None:
    """Same size, other bytes, written after the manifest was hashed: rsync copies the new bytes faithfully,
    the source's stamps give it away, and the final path keeps the previous model."""
    source = _model(tmp_path / "src", {"a.bin": b"A" * 1000, "b.bin": b"B" * 1000})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)
    (source / "b.bin").write_bytes(b"C" * 1000)
    new = Options(accept_models=frozenset({str(dest)}))  # a new model, accepted: the copy protocol is tested
    ctx = Context(ctx.spec, ctx.remote, new, Artifacts(manifests={str(source): build_local_manifest(source)}))
    op = ModelSync()
    plan = op.plan(ctx)
    time.sleep(0.01)  # a write within the same mtime tick would still change the inode below
    (source / "b.bin").unlink()
    (source / "b.bin").write_bytes(b"D" * 1000)
    with pytest.raises(ManifestMismatchError, match=r"the source changed during the copy: b\.bin"):
        op.apply(ctx, plan)
    assert (dest / "b.bin").read_bytes() == b"B" * 1000


def test_interrupted_copy_leaves_no_partial_model(tmp_path: Path) -> None:
    source = _model(tmp_path / "src", {"a.bin": b"A" * 1000, "b.bin": b"B" * 1000})
    ctx, dest = _ctx(tmp_path, source)
    op = ModelSync()
    plan = op.plan(ctx)
    # run the plan up to (not including) the push, then "crash" half way: one file staged
    cut = next(i for i, a in enumerate(plan.actions) if isinstance(a, Push))
    for action in plan.actions[:cut]:
        assert isinstance(action, Cmd | Verify)
        if isinstance(action, Cmd):
            ctx.remote.run(action)
    staging = dest.parent / f".opsctl-sync-{dest.name}"
    (staging / "a.bin").write_bytes(b"A" * 1000)
    assert not dest.exists()
    # the next run resumes from the staging dir and completes
    again = op.plan(ctx)
    assert "absent" in again.notes[0]
    op.apply(ctx, again)
    assert (dest / "b.bin").read_bytes() == b"B" * 1000
    assert not staging.exists()


def test_remote_failure_mid_copy_keeps_final_path_absent(tmp_path: Path) -> None:
    source = _model(tmp_path / "src", {"a.bin": b"A" * 10})
    ctx, dest = _ctx(tmp_path, source)

    class BrokenSync(LocalHost):
        def sync_dir(self, local_dir: Path, remote_dir: str, progress: object = None) -> None:
            (Path(remote_dir) / "a.bin").write_bytes(b"A" * 5)  # half a file, then the link drops
            raise RemoteError("local", "rsync", 255, "connection lost")

    broken = Context(ctx.spec, BrokenSync(), artifacts=ctx.artifacts)
    op = ModelSync()
    with pytest.raises(RemoteError):
        op.apply(broken, op.plan(broken))
    assert not dest.exists()


def test_python_and_coreutils_listings_agree(tmp_path: Path) -> None:
    """The host hasher (python3 hashlib) and the fallback (sha256sum per file) print the same listing."""
    _model(tmp_path / "m", {"a.bin": b"A" * 3000, "sub/b.bin": b"B" * 10, "empty": b""})
    (tmp_path / "m" / MANIFEST_NAME).write_text("{}")
    host = LocalHost()
    fast = parse_hash_listing(host.run(hash_listing_cmd(str(tmp_path / "m"))).stdout)
    slow = parse_hash_listing(host.run(Cmd.of("sh", "-c", _coreutils_listing(str(tmp_path / "m")))).stdout)
    assert fast == slow
    assert sorted(fast) == ["a.bin", "empty", "sub/b.bin"]
    assert fast["a.bin"] == FileEntry(3000, sha256_file(tmp_path / "m" / "a.bin"))
    assert host.run(hash_listing_cmd(str(tmp_path / "absent"))).stdout == ""


def test_corrupt_source_is_refused_never_copied_and_only_accepting_it_changes_the_truth(
    tmp_path: Path, _trust_root: Path
) -> None:
    source = _model(tmp_path / "src", {"config.json": b"{}", "w.bin": b"A" * 4096})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)  # first use: the source's manifest becomes the accepted model
    record = trust.parse_trusted((_trust_root / "model" / "trusted.json").read_text())
    assert record is not None and record.how == "first use"
    assert record.manifest == build_local_manifest(source)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with (source / "w.bin").open("r+b") as fh:  # one byte flipped in the source, size kept
        fh.seek(100)
        fh.write(b"B")
    corrupt = Context(ctx.spec, ctx.remote, artifacts=Artifacts(manifests={str(source): build_local_manifest(source)}))
    with pytest.raises(ModelNotTrustedError) as refused:
        ModelSync().plan(corrupt)
    line = refused.value.one_line()
    assert "is not the model accepted" in line and "differ: w.bin" in line and "nothing was copied" in line
    assert f"--accept-model {dest}" in line and "\n" not in line
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before  # manifest and weights untouched
    # the explicit act: accepted, copied, and recorded as the new truth
    accepted = Context(ctx.spec, ctx.remote, Options(accept_models=frozenset({str(dest)})), corrupt.artifacts)
    _converge(accepted)
    assert (dest / "w.bin").read_bytes()[100:101] == b"B"
    record = trust.parse_trusted((_trust_root / "model" / "trusted.json").read_text())
    assert record is not None and record.how == "accepted" and record.manifest == build_local_manifest(source)
    assert ModelSync().plan(corrupt).actions == ()  # accepted once: later runs need no flag


def test_a_host_from_before_records_still_refuses_a_source_corrupted_since(tmp_path: Path, _trust_root: Path) -> None:
    # Provisioned by an opsctl without trust records: the manifest an earlier provision verified in /dev/shm is
    # what the model was, so a source corrupted before the upgrade is refused, not accepted on "first use".
    source = _model(tmp_path / "src", {"w.bin": b"A" * 4096})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)
    (_trust_root / "model" / "trusted.json").unlink()
    trust.local_path(ctx.spec, str(dest)).unlink()  # nor had the control machine kept a copy
    (source / "w.bin").write_bytes(b"B" * 4096)
    corrupt = Context(ctx.spec, ctx.remote, artifacts=Artifacts(manifests={str(source): build_local_manifest(source)}))
    with pytest.raises(ModelNotTrustedError, match=r"differ: w\.bin.*earlier manifest"):
        ModelSync().plan(corrupt)
    assert (dest / "w.bin").read_bytes() == b"A" * 4096


def test_good_files_rewritten_since_verification_are_verified_again_once() -> None:
    # The bytes match the manifest, but their ctime is newer than it (a repair by hand, a rewrite in place): the
    # facts step hashed them, so the manifest is written again and later checks need not hash them.
    good = {"config.json": FileEntry(100, A), "model.safetensors": FileEntry(1000, B)}
    facts = ModelFacts(True, good, MANIFEST, {}, False, ROOMY, ("model.safetensors",))
    actions, notes = plan_model(SPEC, MANIFEST, facts)
    assert [a.display() for a in actions] == ["write /dev/shm/m/.opsctl-manifest.json (280 bytes, mode 644)"]
    assert notes[-1] == "/dev/shm/m: model.safetensors written since the last verification: verified"
    settled = ModelFacts(True, good, MANIFEST, {}, False, ROOMY)
    assert plan_model(SPEC, MANIFEST, settled)[0] == []


# --- the control machine's copy of the record ("nothing anywhere remembers what the model was") -----


def _flip(path: Path, at: int = 100) -> None:
    with path.open("r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _fresh(ctx: Context, source: Path, accept: frozenset[str] = frozenset()) -> Context:
    manifests = {str(source): build_local_manifest(source)}
    return Context(ctx.spec, ctx.remote, Options(accept_models=accept), artifacts=Artifacts(manifests=manifests))


def test_the_control_machine_keeps_a_copy_of_the_record(tmp_path: Path, _trust_root: Path) -> None:
    source = _model(tmp_path / "src", {"w.bin": b"A" * 4096})
    ctx, dest = _ctx(tmp_path, source)
    plan = ModelSync().plan(ctx)
    copy = trust.local_path(ctx.spec, str(dest))
    assert copy == Path(os.environ["XDG_STATE_HOME"]) / "opsctl" / "trust" / "local@127.0.0.1" / "model.json"
    assert f"keep {copy} on the control machine" in " ".join(plan.commands()) and not copy.exists()  # plan only
    ModelSync().apply(ctx, plan)
    assert copy.read_text() == (_trust_root / "model" / "trusted.json").read_text()
    assert ModelSync().plan(ctx).actions == ()  # both records agree: nothing to do


def test_a_host_that_lost_its_record_still_refuses_a_corrupt_source_and_gets_the_record_back(
    tmp_path: Path, _trust_root: Path
) -> None:
    source = _model(tmp_path / "src", {"config.json": b"{}", "w.bin": b"A" * 4096})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)
    accepted = (_trust_root / "model" / "trusted.json").read_text()
    shutil.rmtree(_trust_root)  # the host's state is gone (disk replaced) ...
    shutil.rmtree(dest)  # ... and so is /dev/shm (a reboot): the host remembers nothing
    _flip(source / "w.bin")
    with pytest.raises(ModelNotTrustedError) as refused:
        ModelSync().plan(_fresh(ctx, source))
    line = refused.value.one_line()
    assert "differ: w.bin" in line and "the control machine's copy" in line and "nothing was copied" in line
    assert not dest.exists() and not _trust_root.exists()  # nothing copied, nothing recorded
    _flip(source / "w.bin")  # the source restored from a good copy
    _converge(_fresh(ctx, source))
    assert (dest / "w.bin").read_bytes() == b"A" * 4096
    record = trust.parse_trusted((_trust_root / "model" / "trusted.json").read_text())
    assert record is not None and record.how == "earlier record"
    assert record.manifest == trust.parse_trusted(accepted).manifest  # type: ignore[union-attr]


def test_a_host_record_that_differs_from_the_control_machines_copy_is_refused_until_accepted(
    tmp_path: Path, _trust_root: Path
) -> None:
    source = _model(tmp_path / "src", {"w.bin": b"A" * 4096})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)
    copy = trust.local_path(ctx.spec, str(dest))
    kept = copy.read_text()
    # another control machine accepted a new model on this host: the host's record and the source moved on
    (source / "w.bin").write_bytes(b"N" * 4096)
    other = build_local_manifest(source)
    (_trust_root / "model" / "trusted.json").write_text(
        trust.Trusted(other, "2026-01-01T00:00:00Z", "accepted").to_json()
    )
    with pytest.raises(ModelNotTrustedError) as refused:
        ModelSync().plan(_fresh(ctx, source))
    line = refused.value.one_line()
    assert "the host's record of the model accepted for" in line and "is not the control machine's copy" in line
    assert f"--accept-model {dest}" in line and "\n" not in line
    assert copy.read_text() == kept and (dest / "w.bin").read_bytes() == b"A" * 4096  # nothing changed
    _converge(_fresh(ctx, source, frozenset({str(dest)})))  # the operator says the host's record is right
    here = trust.read_local(ctx.spec, str(dest))
    assert here is not None and here.manifest == other
    assert (dest / "w.bin").read_bytes() == b"N" * 4096
    assert ModelSync().plan(_fresh(ctx, source)).actions == ()  # reconciled: later runs need no flag


def test_accepting_a_model_is_audited_and_planned(
    tmp_path: Path, _trust_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`provision --accept-model` changes the trusted model, so it is audited."""
    from opsctl.kernel import audit

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(audit, "HOST_LOG", str(tmp_path / "host" / "audit.log"))
    source = _model(tmp_path / "src", {"w.bin": b"A" * 4096})
    ctx, dest = _ctx(tmp_path, source)
    _converge(ctx)  # first use: recorded, not an accept
    assert not (tmp_path / "host" / "audit.log").exists()
    (source / "w.bin").write_bytes(b"B" * 4096)
    manifests = {str(source): build_local_manifest(source)}
    options = Options(accept_models=frozenset({str(dest)}))
    accepted = Context(ctx.spec, ctx.remote, options, Artifacts(manifests=manifests))
    commands = _converge(accepted)
    assert commands[-1].startswith(f"audit accept-model: {dest}: sha256:")  # what --plan shows, last
    host_log = (tmp_path / "host" / "audit.log").read_text().splitlines()
    local_log = (tmp_path / "state" / "opsctl" / "audit.log").read_text().splitlines()
    assert len(host_log) == 1 and host_log == local_log
    assert "action=accept-model" in host_log[0] and "result=ok" in host_log[0] and "host=local" in host_log[0]
    assert "was sha256:" in host_log[0] and "differ: w.bin" in host_log[0]


# rsync 3.5.0's merged stdout+stderr (--info=progress2) when the disk fills under it, recorded copying 7 MB into a
# 5 MiB tmpfs (only the staging path changed): its error arrives glued to the last progress counter, no line break
RECORDED_FULL = Path(__file__).parents[1] / "fixtures" / "rsync" / "enospc_progress2.out"
RSYNC_FULL = (
    'rsync: [receiver] write failed on "/dev/shm/.opsctl-sync-m/w.bin": No space left on device (28)\n'
    "rsync error: error in file IO (code 11) at receiver.c(657) [receiver=3.5.0]\n"
    "rsync: [sender] write error: Broken pipe (32)\n"
)
DF_AFTER = "Filesystem 1B-blocks Used Available Capacity Mounted on\ntmpfs 5242880 1048576 4194304 20% /dev/shm\n"


def _streamed_failure(progress: list[str]) -> RemoteError:
    """What SshHost's streamed rsync raises when rsync prints the recorded output and exits 11."""
    host = Host("h1", "10.0.0.1", SshConfig(), 0, "/v", "python3", "0.5.23", None, None, ())
    with pytest.raises(RemoteError) as info:
        SshHost(host)._rsync_streamed(["sh", "-c", f"cat {RECORDED_FULL}; exit 11"], "/dev/shm/x/", progress.append)
    return info.value


def test_rsync_error_glued_to_a_progress_line_is_kept_and_the_progress_still_shown() -> None:
    progress: list[str] = []
    err = _streamed_failure(progress)
    assert progress == ["32.8 kB (0%), 0.00kB/s, ETA 0:00:00", "3.0 MB (42%), 353.72MB/s, ETA 0:00:00"]
    assert err.remote_exit_code == 11
    assert err.tail.splitlines()[0] == (
        'rsync: [receiver] write failed on "/dev/shm/.opsctl-sync-m/b.safetensors": No space left on device (28)'
    )
    assert disk_full(err.tail) is not None and "xfr#" not in err.tail and "353.72MB/s" not in err.tail


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("  1,024  10%  1.00MB/s  0:00:09", ("1.0 kB (10%), 1.00MB/s, ETA 0:00:09", "")),
        ("  1,024 100%  1.00MB/s  0:00:00 (xfr#3, to-chk=0/3)", ("1.0 kB (100%), 1.00MB/s, ETA 0:00:00", "")),
        (
            "  1,024  10%  1.00MB/s  0:00:09 (xfr#1, ir-chk=5/9)rsync: x",
            ("1.0 kB (10%), 1.00MB/s, ETA 0:00:09", "rsync: x"),
        ),
        ("  1,024  10%  1.00MB/s  0:00:09  rsync error: y", ("1.0 kB (10%), 1.00MB/s, ETA 0:00:09", "rsync error: y")),
        ("rsync: [sender] write error: Broken pipe (32)", (None, "rsync: [sender] write error: Broken pipe (32)")),
        ("", (None, "")),
    ],
)
def test_split_progress(line: str, want: tuple[str | None, str]) -> None:
    assert split_progress(line) == want


class _FullHost(FakeHost):
    """A host whose /dev/shm fills up while rsync pushes the model: SshHost's own streamed rsync reading what rsync
    printed when it happened."""

    def sync_dir(self, local_dir: Path, remote_dir: str, progress: object = None) -> None:
        raise _streamed_failure([])


def _one_model_host(spec: ModelSpec) -> Host:
    svc = Service("s", "h1", (), 30000, Mode.BASELINE, Engine.REFERENCE, spec, None, DDTreeKnobs())
    return Host("h1", "10.0.0.1", SshConfig(), 0, "/v", "python3", "0.5.23", None, None, (svc,))


def _df(cmd: Cmd) -> tuple[int, str, str] | None:
    return (0, DF_AFTER, "") if cmd.argv[0] == "df" else None


def test_a_disk_that_fills_during_the_copy_is_one_line_and_the_partial_copy_is_removed(tmp_path: Path) -> None:
    """/dev/shm filling during a model copy gave the raw rsync command line and "exited 11", and left the temp dir
    behind: rsync's "No space left on device" came glued to a progress line, which the progress parser dropped."""
    spec = ModelSpec(str(_model(tmp_path / "m", {"config.json": b"{}"})), ModelSourceKind.CONTROL, "/dev/shm/m", False)
    host = _one_model_host(spec)
    actions, _ = plan_model(spec, MANIFEST, facts(None), "h1")
    fake = _FullHost("h1", handler=_df)
    with pytest.raises(ProvisionError) as info:
        ModelSync().apply(Context(host, fake), Plan("model_sync", actions=tuple(actions)))
    line = info.value.one_line()
    assert line.startswith("/dev/shm on h1 is full: 1.1 KiB needed, 4.0 MiB free (the copy of m ran out of space: ")
    assert "No space left on device (28)" in line and "exited 11" not in line and "xfr#" not in line
    assert "rsync -a" not in line and "BatchMode" not in line and "\n" not in line
    assert "; the partial copy was removed (/dev/shm/.opsctl-sync-m)" in line
    assert line.endswith("remove models no service uses) or enlarge it, then provision again)")
    assert "rm -rf -- /dev/shm/.opsctl-sync-m" in fake.ran
    # a model on the host: its own rsync command fails the same way
    on_host = ModelSpec("/data/m", ModelSourceKind.HOST, "/dev/shm/m", hybrid=False)
    actions, _ = plan_model(on_host, MANIFEST, facts(None), "h1")

    def full_rsync(cmd: Cmd) -> tuple[int, str, str] | None:
        return (11, "", RSYNC_FULL) if cmd.argv[0] == "rsync" else _df(cmd)

    full = FakeHost("h1", handler=full_rsync)
    with pytest.raises(ProvisionError, match=r"^/dev/shm on h1 is full: 1\.1 KiB needed, 4\.0 MiB free \(the copy"):
        ModelSync().apply(Context(_one_model_host(on_host), full), Plan("model_sync", actions=tuple(actions)))
    assert "rm -rf -- /dev/shm/.opsctl-sync-m" in full.ran


def test_the_space_is_checked_again_right_before_the_copy(tmp_path: Path) -> None:
    """Two models that each fit alone, or space taken between the plan and the copy: refused before the copy
    starts, in one line, and the staging dir goes."""
    spec = ModelSpec(str(_model(tmp_path / "m", {"config.json": b"{}"})), ModelSourceKind.CONTROL, "/dev/shm/m", False)
    actions, _ = plan_model(spec, MANIFEST, facts(None), "h1")
    tiny = "Filesystem 1B-blocks Used Available Capacity Mounted on\ntmpfs 2000 1500 500 75% /dev/shm\n"
    fake = FakeHost("h1", handler=lambda cmd: (0, tiny, "") if cmd.argv[0] == "df" else None)
    with pytest.raises(ShmTooSmallError) as info:
        ModelSync().apply(Context(_one_model_host(spec), fake), Plan("model_sync", actions=tuple(actions)))
    assert info.value.one_line() == (
        "/dev/shm on h1 is full: 1.1 KiB needed, 500 B free (m: 1100 bytes to copy, 500 bytes free); nothing was "
        "copied; the staging dir was removed (/dev/shm/.opsctl-sync-m) (free space in /dev/shm (df -h /dev/shm; "
        "remove models no service uses) or enlarge it, then provision again)"
    )
    assert fake.ran[-1] == "rm -rf -- /dev/shm/.opsctl-sync-m" and fake.synced == []


def test_other_copy_failures_are_not_called_a_full_disk() -> None:
    assert disk_full("rsync: connection unexpectedly closed (0 bytes received so far)") is None
    assert disk_full("cp: error writing 'x': Disk quota exceeded") == "cp: error writing 'x': Disk quota exceeded"
    assert isinstance(rsync_error("h", "rsync ...", 12, RSYNC_FULL), RemoteError)  # not "unreachable"
