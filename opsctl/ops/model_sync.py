"""model_sync: every model and draft model of a host's services at its ModelSpec.path (under /dev/shm), whole
and verified.

Copy protocol (the final path never holds a partial model):
1. read the manifest (size + sha256 per file) of the source: hashed on the control machine (cached by size and
   mtime) or on the host for a host-side source;
2. hash what the host has at the final path and in the staging dir `.opsctl-sync-<name>` (a previous,
   interrupted run); skip the model when the final path matches the manifest;
3. refuse when /dev/shm cannot hold the bytes still to copy, with the numbers;
4. stage: hard-link the files that are already good at the final path (tmpfs hard links cost no space), drop
   corrupted or stale files, rsync the source over the staging dir, verify, write the manifest into it.
   Verifying a control-side copy does not re-read it: every staged file is either one hashed in step 2 or one
   rsync wrote in this run and checked against the bytes its sender read (rsync's whole-file checksum; a
   mismatch fails the copy), and the source's (size, mtime, inode) still being those of its manifest proves
   the sender read the hashed bytes; so the host lists sizes only. Other copies are hashed after the copy;
5. swap: final -> .opsctl-old-<name>, staging -> final (two renames), remove the old copy.

Before step 2, the source's manifest is judged against the model accepted on the host (opsctl.ops.model_trust):
a source that differs is refused, so a corrupted source never becomes the new truth. The services whose model
was copied anew are restarted, and provision waits (bounded by their health_timeout) until they are healthy
(opsctl.ops.service_wait), so a smoke right after provision is answered.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from opsctl import layout, systemd
from opsctl.commands import Cmd
from opsctl.errors import (
    ManifestMismatchError,
    ModelNotTrustedError,
    OpsctlError,
    ProvisionError,
    RemoteError,
    ShmTooSmallError,
)
from opsctl.facts import modelcheck, trust
from opsctl.facts.manifest import (
    MANIFEST_NAME,
    DirState,
    FileEntry,
    Manifest,
    compare,
    hash_listing_cmd,
    parse_hash_listing,
    parse_manifest_json,
    parse_size_listing,
    size_listing_cmd,
    source_stamps,
)
from opsctl.facts.system import DiskSpace, parse_df, size_iec
from opsctl.inventory.model import Host, ModelSourceKind, ModelSpec
from opsctl.ops import model_trust, service_wait
from opsctl.ops.base import Action, Audit, Context, Plan, Push, PutText, Verify, execute, read
from opsctl.remote.base import Connection

NAME = "model_sync"
COPY_TIMEOUT_S = 7200.0


@dataclass(frozen=True)
class ModelPaths:
    final: str
    staging: str
    old: str

    @staticmethod
    def of(path: str) -> ModelPaths:
        final = path.rstrip("/")
        parent, name = posixpath.split(final)
        return ModelPaths(final, f"{parent}/.opsctl-sync-{name}", f"{parent}/.opsctl-old-{name}")

    @property
    def parent(self) -> str:
        return posixpath.dirname(self.final)


@dataclass(frozen=True)
class ModelFacts:
    final_exists: bool
    final: Mapping[str, FileEntry]  # hash listing of the final path
    stored_manifest: Manifest | None  # .opsctl-manifest.json at the final path
    staging: Mapping[str, FileEntry]  # hash listing of the staging dir (empty when absent)
    staging_exists: bool
    space: DiskSpace  # of the filesystem holding the final path
    # files at the final path written after its manifest (ctime): hashed above, so verified again by this run
    unverified: tuple[str, ...] = ()


def models_of(host: Host) -> list[ModelSpec]:
    """Distinct models (by destination) of the host's services, in service order."""
    seen: dict[str, ModelSpec] = {}
    for svc in host.services:
        for spec in (svc.model, svc.draft_model):
            if spec is not None and spec.path not in seen:
                seen[spec.path] = spec
    return list(seen.values())


def shm_full(mount: str, host: str, need: int, free: int) -> str:
    """The one line for a model that does not fit: `/dev/shm on lab2 is full: 1.2 GiB needed, 300.0 MiB free`."""
    return f"{mount} on {host} is full: {size_iec(need)} needed, {size_iec(free)} free"


def shm_hint(mount: str) -> str:
    return f"free space in {mount} (df -h {mount}; remove models no service uses) or enlarge it, then provision again"


@dataclass(frozen=True)
class RoomFor:
    """The judge of `df` right before a model's copy: the bytes still to copy must fit. The plan checked it when
    it read its facts; this checks it again when the copy starts (an earlier model of the same run, or anything
    else on the host, may have taken the space since), and a copy that fills the disk anyway is reported with
    the bytes it needed (`ModelSync.apply`)."""

    host: str
    model: str
    staging: str
    need: int  # bytes

    def __call__(self, exit_code: int, stdout: str, stderr: str) -> None:
        if exit_code != 0:
            raise ProvisionError(f"df of {posixpath.dirname(self.staging)} failed: {stderr.strip()[-200:]}")
        space = parse_df(stdout)
        if space.available < self.need:
            raise ShmTooSmallError(
                f"{shm_full(space.mount, self.host, self.need, space.available)} ({self.model}: {self.need} bytes "
                f"to copy, {space.available} bytes free); nothing was copied",
                shm_hint(space.mount),
            )


def plan_model(
    spec: ModelSpec, manifest: Manifest, facts: ModelFacts, host: str = "the host"
) -> tuple[list[Action], list[str]]:
    """The pure decision for one model on `host`: (actions, notes)."""
    p = ModelPaths.of(spec.path)
    state = compare(manifest, facts.final) if facts.final_exists else None
    if state is not None and state.matches:
        actions: list[Action] = []
        notes = [f"{p.final}: {len(manifest.files)} files, {size_iec(manifest.total_bytes)}, manifest verified"]
        if facts.stored_manifest != manifest:
            actions.append(PutText(f"{p.final}/{MANIFEST_NAME}", manifest.to_json()))
            notes.append(f"{p.final}: write the manifest")
        elif facts.unverified:  # rewritten with the right bytes: say so, or every later check hashes them again
            actions.append(PutText(f"{p.final}/{MANIFEST_NAME}", manifest.to_json()))
            notes.append(f"{p.final}: {_few(list(facts.unverified))} written since the last verification: verified")
        if facts.staging_exists:
            actions.append(Cmd.of("rm", "-rf", p.staging))
        return actions, notes
    staged = compare(manifest, facts.staging)
    good_final = state.good if state is not None else frozenset()
    have = good_final | staged.good
    need = sum(e.size for path, e in manifest.files.items() if path not in have)
    if need > facts.space.available:
        raise ShmTooSmallError(
            f"{shm_full(facts.space.mount, host, need, facts.space.available)} ({spec.name}: {need} bytes to copy "
            f"of {size_iec(manifest.total_bytes)}, {facts.space.available} bytes free); nothing was copied",
            shm_hint(facts.space.mount),
        )
    notes = [_why(p, manifest, state, need)]
    actions = [Cmd.of("rm", "-rf", p.old), Cmd.of("mkdir", "-p", p.staging)]
    drop = sorted((staged.bad | staged.extra) - good_final)
    if drop:
        actions.append(Cmd.of("rm", "-f", "--", *(f"{p.staging}/{f}" for f in drop)))
    link = sorted(good_final - staged.good)
    if link:
        cp = shlex.join(["cp", "-alf", "--parents", "-t", p.staging, "--", *link])
        actions.append(Cmd.of("sh", "-c", f"cd {shlex.quote(p.final)} && {cp}"))
    room = RoomFor(host, spec.name, p.staging, need)
    actions.append(Verify(Cmd.of("df", "-P", "-B1", p.parent), room, f"room for {size_iec(need)} in {p.parent}"))
    actions += _copy(spec, manifest, p.staging)
    actions.append(PutText(f"{p.staging}/{MANIFEST_NAME}", manifest.to_json()))
    final, staging, old = (shlex.quote(x) for x in (p.final, p.staging, p.old))
    # Removing the old copy drops a link of each hard-linked good file, which moves its ctime: touching the
    # manifest last keeps "written after the manifest" meaning "written after provision verified it".
    touch = shlex.quote(f"{p.final}/{MANIFEST_NAME}")
    swap = f"if [ -e {final} ]; then mv -T {final} {old}; fi; mv -T {staging} {final}; rm -rf {old}; touch -- {touch}"
    actions.append(Cmd.of("sh", "-c", f"set -e; {swap}"))
    return actions, notes


def _copy(spec: ModelSpec, manifest: Manifest, staging: str) -> list[Action]:
    """rsync the source over the staging dir, then prove the staged files are the manifest's."""
    hashed = Verify(
        hash_listing_cmd(staging),
        judge=_verify_judge(spec.name, manifest),
        what=f"sha256 of {len(manifest.files)} files",
        shown=f"hash every file in {staging} (python3 hashlib on every CPU), compare with the manifest",
    )
    if spec.source_on is ModelSourceKind.HOST:
        return [Cmd.of("rsync", "-a", f"{spec.source.rstrip('/')}/", f"{staging}/"), hashed]
    push = Push(Path(spec.source), staging)
    if set(manifest.stamps) != set(manifest.files):  # a manifest not built from this source here: hash the copy
        return [push, hashed]
    sized = Verify(
        size_listing_cmd(staging),
        judge=_sizes_judge(spec.name, manifest, Path(spec.source)),
        what=f"{len(manifest.files)} files",
        shown=f"sizes in {staging} as in the manifest, and {spec.source} unchanged since it was hashed "
        "(rsync checked every byte it wrote against what its sender read)",
    )
    return [push, sized]


def _why(p: ModelPaths, manifest: Manifest, state: DirState | None, need: int) -> str:
    size = f"{len(manifest.files)} files, {size_iec(manifest.total_bytes)}"
    if state is None:
        return f"{p.final}: absent; copy {size} ({size_iec(need)} to transfer)"
    parts = []
    if state.bad:
        parts.append(f"{len(state.bad)} corrupted or changed ({', '.join(sorted(state.bad)[:3])})")
    if state.missing:
        parts.append(f"{len(state.missing)} missing")
    if state.extra:
        parts.append(f"{len(state.extra)} not in the source")
    return f"{p.final}: {'; '.join(parts)}; re-copy ({size_iec(need)} to transfer)"


def _verify_judge(name: str, manifest: Manifest) -> Callable[[int, str, str], None]:
    def judge(exit_code: int, stdout: str, stderr: str) -> None:
        if exit_code != 0:
            raise ManifestMismatchError(f"{name}: hashing the staged copy failed: {stderr.strip()[-200:]}")
        state = compare(manifest, parse_hash_listing(stdout))
        if not state.matches:
            wrong = sorted(state.bad | state.missing | state.extra)
            raise ManifestMismatchError(
                f"{name}: the copy does not match the source manifest: {_few(wrong)}",
                "the source changed during the copy, or the host's memory is faulty; run provision again",
            )

    return judge


def _sizes_judge(name: str, manifest: Manifest, source: Path) -> Callable[[int, str, str], None]:
    def judge(exit_code: int, stdout: str, stderr: str) -> None:
        if exit_code != 0:
            raise ManifestMismatchError(f"{name}: listing the staged copy failed: {stderr.strip()[-200:]}")
        sizes = parse_size_listing(stdout)
        wrong = sorted(p for p in manifest.files.keys() | sizes.keys() if sizes.get(p) != _size(manifest, p))
        if wrong:
            raise ManifestMismatchError(
                f"{name}: the copy does not match the source manifest: {_few(wrong)}",
                "the host's staging directory was changed during the copy; run provision again",
            )
        now = source_stamps(source, manifest.files)
        changed = sorted(p for p, stamp in now.items() if stamp != manifest.stamps[p])
        if changed:
            raise ManifestMismatchError(
                f"{name}: the source changed during the copy: {_few(changed)}",
                "run provision again once nothing writes to the model source",
            )

    return judge


def _size(manifest: Manifest, path: str) -> int | None:
    entry = manifest.files.get(path)
    return None if entry is None else entry.size


def _few(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def read_facts(remote: Connection, spec: ModelSpec) -> ModelFacts:
    p = ModelPaths.of(spec.path)
    final_exists = read(remote, Cmd.of("test", "-d", p.final)).exit_code == 0
    staging_exists = read(remote, Cmd.of("test", "-d", p.staging)).exit_code == 0
    final = _listing(remote, p.final) if final_exists else {}
    staging = _listing(remote, p.staging) if staging_exists else {}
    stored = read(remote, Cmd.of("cat", f"{p.final}/{MANIFEST_NAME}")) if final_exists else None
    space = read(remote, Cmd.of("df", "-P", "-B1", p.parent))
    if space.exit_code != 0:
        raise ProvisionError(f"{p.parent} does not exist on the host", "models go under /dev/shm")
    unverified: tuple[str, ...] = ()
    if stored is not None and stored.exit_code == 0:
        newer = read(remote, newer_than_manifest_cmd(p.final))
        unverified = tuple(sorted(line for line in newer.stdout.splitlines() if line)) if newer.ok else ()
    return ModelFacts(
        final_exists,
        final,
        parse_manifest_json(stored.stdout) if stored is not None and stored.exit_code == 0 else None,
        staging,
        staging_exists,
        parse_df(space.stdout),
        unverified,
    )


def newer_than_manifest_cmd(directory: str) -> Cmd:
    """Files whose ctime is newer than the manifest's mtime (when it was written): `<relpath>` per line."""
    d = shlex.quote(directory)
    newer = f"-cnewer {MANIFEST_NAME} -printf '%P\\n'"
    return Cmd.of("sh", "-c", f"cd {d} && find . -type f ! -name {MANIFEST_NAME} {newer}")


def _listing(remote: Connection, directory: str) -> dict[str, FileEntry]:
    result = read(remote, hash_listing_cmd(directory), timeout=3600.0)
    if result.exit_code != 0:
        raise ProvisionError(f"hashing {directory} failed: {result.stderr.strip()[-200:]}")
    return parse_hash_listing(result.stdout)


def host_source_manifest(remote: Connection, spec: ModelSpec) -> Manifest:
    if read(remote, Cmd.of("test", "-d", spec.source)).exit_code != 0:
        raise ProvisionError(f"model source {spec.source} does not exist on the host", "fix models.source")
    return Manifest(_listing(remote, spec.source))


def manifest_for(ctx: Context, spec: ModelSpec) -> Manifest:
    if spec.source_on is ModelSourceKind.HOST:
        return host_source_manifest(ctx.remote, spec)
    manifest = ctx.artifacts.manifests.get(spec.source)
    if manifest is None:
        raise ProvisionError(f"no manifest for {spec.source} (it is built before hosts are provisioned)")
    return manifest


class ModelSync:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        actions: list[Action] = []
        notes: list[str] = []
        replaced: list[ModelSpec] = []  # models this run copies anew
        for spec in models_of(ctx.spec):
            manifest = manifest_for(ctx, spec)
            if not manifest.files:
                raise ProvisionError(f"model source {spec.source} has no files", "fix models.source")
            verdict, on_host = judge_trust(ctx, spec, manifest)  # before anything is read or copied
            acts, why = plan_model(spec, manifest, read_facts(ctx.remote, spec), ctx.spec.name)
            if any(isinstance(a, Verify) for a in acts):  # only a copy verifies
                replaced.append(spec)
            record = new_record(manifest, verdict)
            acts += trust_actions(spec, record)
            acts += model_trust.keep_local(ctx.spec, spec, record, on_host)
            if verdict.trust is model_trust.Trust.ACCEPTED:  # the one act that changes the trusted model
                was = on_host.describe() if on_host is not None else "no record on the host"
                detail = f"{spec.path.rstrip('/')}: {trust.digest(manifest)} (was {was}; {verdict.detail})"
                acts.append(Audit(ctx.spec, "accept-model", detail))
            actions += acts
            notes += why
            if verdict.record:
                digest = trust.digest(manifest)
                notes.append(f"{spec.path.rstrip('/')}: record {digest} as the accepted model ({_how(verdict)})")
        if not models_of(ctx.spec):
            notes.append("no models (the host has no services)")
        users = model_users(ctx.spec, replaced)
        users += [u for u in changed_under(ctx) if u not in users]
        restart = deployed(ctx.remote, users)
        actions += [cmd for unit in restart for cmd in restart_cmds(unit)]
        notes += [f"restart {u}: its model is copied anew or changed after it started" for u in restart]
        return Plan(NAME, actions=tuple(actions), notes=tuple(notes))

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        try:
            execute(ctx.remote, plan.actions, timeout=COPY_TIMEOUT_S, progress=ctx.progress)
        except ShmTooSmallError as exc:  # the check right before a copy: the partial copy holds space too
            removed = _remove_staging(ctx, plan)
            raise ShmTooSmallError(f"{exc.message}{_cleaned(removed, 'the staging dir')}", exc.hint) from None
        except RemoteError as exc:
            full = disk_full(exc.message + "\n" + exc.tail)
            if full is None:
                raise
            raise _out_of_space(ctx, plan, full) from None
        # Re-reading facts would hash everything again; the copy was verified before the rename.
        restarted = [s for s in ctx.spec.services if systemd.restart_cmd(layout.unit_name(s.name)) in plan.actions]
        waited = service_wait.wait_healthy(ctx, restarted)
        return Plan(NAME, notes=(*plan.notes, *waited))


# What a write that ran out of space says (rsync, cp, python): ENOSPC and EDQUOT, as strerror spells them
_FULL = ("No space left on device", "Disk quota exceeded")


def disk_full(output: str) -> str | None:
    """The line of a failed command's output that says the disk filled up, or None. Pure."""
    for line in output.splitlines():
        if any(word in line for word in _FULL):
            return line.strip()
    return None


def _staged(plan: Plan) -> list[RoomFor]:
    """The copies this plan makes (their staging dirs and the bytes each needed), in plan order."""
    return [a.judge for a in plan.actions if isinstance(a, Verify) and isinstance(a.judge, RoomFor)]


def _remove_staging(ctx: Context, plan: Plan) -> dict[str, bool]:
    """Each partial copy of this plan removed (they hold the space): staging dir -> removed."""
    removed: dict[str, bool] = {}
    for room in _staged(plan):
        try:
            ctx.remote.run(Cmd.of("rm", "-rf", "--", room.staging, sudo=True), timeout=600)
            removed[room.staging] = True
        except OpsctlError:
            removed[room.staging] = False  # reported as not removed
    return removed


def _cleaned(removed: dict[str, bool], what: str = "the partial copy") -> str:
    gone = [path for path, ok in removed.items() if ok]
    kept = [path for path, ok in removed.items() if not ok]
    said = f"; {what} was removed ({', '.join(gone)})" if gone else ""
    return said + (f"; not removed: {', '.join(kept)}" if kept else "")


def _out_of_space(ctx: Context, plan: Plan, line: str) -> ProvisionError:
    """A copy that filled the disk: its partial copies removed, and one line with the bytes it needed and what is
    free now. The copy that failed is the one whose staging dir rsync names (else all of this plan's)."""
    rooms = _staged(plan)
    failed = [r for r in rooms if f"{r.staging}/" in line] or rooms
    removed = _remove_staging(ctx, plan)
    parent = posixpath.dirname(rooms[0].staging) if rooms else "/dev/shm"
    need = sum(r.need for r in failed)
    try:  # what is free now, the partial copies gone: what the next run has
        space = parse_df(read(ctx.remote, Cmd.of("df", "-P", "-B1", parent)).stdout)
        head = shm_full(space.mount, ctx.spec.name, need, space.available)
        mount = space.mount
    except OpsctlError:
        mount = parent
        head = f"{mount} on {ctx.spec.name} is full: {size_iec(need)} needed"
    names = ", ".join(r.model for r in failed) or "the model"
    why = line if len(line) <= 160 else line[:159] + "…"
    return ShmTooSmallError(f"{head} (the copy of {names} ran out of space: {why}){_cleaned(removed)}", shm_hint(mount))


def judge_trust(
    ctx: Context, spec: ModelSpec, manifest: Manifest
) -> tuple[model_trust.SourceVerdict, trust.Trusted | None]:
    """The source against the model accepted on the host (or the control machine's copy of that record, when
    the host lost it); raises when it differs and was not accepted, or when the two records differ. Returns
    the verdict and the host's own record."""
    on_host = trust.read_trusted(ctx.remote, spec.path)
    here = trust.read_local(ctx.spec, spec.path)
    accept = spec.path.rstrip("/") in ctx.options.accept_models
    settled = model_trust.reconcile(on_host, here)
    if settled.conflict and not accept and on_host is not None and here is not None:
        raise ModelNotTrustedError(
            f"{ctx.spec.name}: the host's record of the model accepted for {spec.path.rstrip('/')} "
            f"({on_host.describe()}) is not the control machine's copy ({here.describe()}, "
            f"{trust.local_path(ctx.spec, spec.path)}); nothing was copied",
            model_trust.conflict_hint(ctx.spec.name, spec),
        )
    trusted = settled.trusted
    verdict = model_trust.judge_source(trusted, manifest, accept)
    if verdict.trust is model_trust.Trust.REFUSED and trusted is not None:
        where = "on the host" if spec.source_on is ModelSourceKind.HOST else "on the control machine"
        raise ModelNotTrustedError(
            f"{ctx.spec.name}: model source {spec.source} ({where}) is not the model accepted for "
            f"{spec.path.rstrip('/')} ({verdict.detail}; source {trust.digest(manifest)}, accepted "
            f"{trusted.describe()}): corrupt or replaced; nothing was copied",
            model_trust.accept_hint(ctx.spec.name, spec),
        )
    return verdict, on_host


def _how(verdict: model_trust.SourceVerdict) -> str:
    """Which act records it: the first copy, an earlier record (an earlier provision's manifest on a host from
    before records, or the control machine's copy of a record the host lost), or --accept-model."""
    return "earlier record" if verdict.trust is model_trust.Trust.MATCHES else verdict.trust.value


def new_record(manifest: Manifest, verdict: model_trust.SourceVerdict) -> trust.Trusted | None:
    """The record this run writes (first use, an earlier record written down, or --accept-model), if any."""
    if not verdict.record:
        return None
    return trust.Trusted(manifest, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), _how(verdict))


def trust_actions(spec: ModelSpec, record: trust.Trusted | None) -> list[Action]:
    """Record the manifest as the accepted model on the host, after any copy of it."""
    if record is None:
        return []
    files = model_trust.record_files(spec, record, restorable=spec.source_on is ModelSourceKind.HOST)
    mkdir: list[Action] = [Cmd.of("mkdir", "-p", trust.state_dir(spec), sudo=True)]
    return mkdir + [PutText(path, text, 0o644) for path, text in files.items()]


def changed_under(ctx: Context) -> list[str]:
    """Units whose (now verified) model files were written after the unit started: a repair by an earlier run
    or by hand that the process never saw."""
    return [
        layout.unit_name(svc.name)
        for svc in ctx.spec.services
        if any(
            v.problem is modelcheck.Problem.CHANGED
            for v in modelcheck.check(ctx.remote, svc, layout.unit_name(svc.name), host=ctx.spec)
        )
    ]


def model_users(host: Host, specs: list[ModelSpec]) -> list[str]:
    """Units of the host's services that use any of these models, in service order, once each."""
    paths = {s.path.rstrip("/") for s in specs}
    return [
        layout.unit_name(svc.name)
        for svc in host.services
        if any(m is not None and m.path.rstrip("/") in paths for m in (svc.model, svc.draft_model))
    ]


def deployed(remote: Connection, units: list[str]) -> list[str]:
    """The units that are deployed (enabled); a service not deployed yet has nothing to restart."""
    return [u for u in units if read(remote, systemd.is_enabled_cmd(u)).exit_code == 0]


def restart_cmds(unit: str) -> list[Cmd]:
    """A process that mapped the old files keeps them until it restarts, and a unit that crash-looped on a
    missing model (after a reboot) has given up: reset its failure count, then restart (waits for the old
    process to stop, so the next check sees the new start time)."""
    return [systemd.reset_failed_cmd(unit), systemd.restart_cmd(unit)]
