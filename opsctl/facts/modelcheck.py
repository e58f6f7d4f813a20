"""Model integrity of a running service: is every model it uses whole, and the same one it started with?

The reference server memory-maps its weights and SGLang reads them once at start, so a model file replaced
or corrupted under a running service is never noticed by `/health`: the process keeps the old (or deleted)
inode. The fact read here compares, per model directory, provision's manifest (`.opsctl-manifest.json`:
size and sha256 per file) with what is on disk, and each file's ctime with the time the unit's main process
started. ctime, not mtime: rsync and `cp -p` keep a source's mtime, while creating, renaming or writing a
file always moves its ctime. The cheap check reads sizes and ctimes (one `find`); `deep` also hashes.

The reference is the model accepted on the host (opsctl.facts.trust) where one is recorded, else the
manifest. Provision writes the manifest after verifying every file, so a file whose ctime is newer than the
manifest's was written after that verification (a byte flipped in place, a copy by hand): every check hashes
exactly those files, so a corrupt model is told from a good copy before anything restarts, at the cost of
reading only what changed. A file written in place is seen at once by a process that maps it (the reference
server maps /dev/shm), so "the process still runs on the old files" is never claimed for it: a changed file is
either corrupt (DAMAGED) or a verified good copy (CHANGED, a restart loads it).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum

from opsctl import systemd
from opsctl.commands import Cmd, sh
from opsctl.facts.manifest import (
    MANIFEST_NAME,
    FileEntry,
    hash_listing_cmd,
    parse_hash_listing,
    parse_manifest_json,
)
from opsctl.facts.manifest import Manifest as ModelManifest
from opsctl.facts.trust import model_name, parse_trusted, read_local, trust_path
from opsctl.inventory.model import Host, ModelSourceKind, ModelSpec, Service
from opsctl.remote.base import Connection


class Problem(StrEnum):
    MISSING = "missing"  # no model directory (a reboot empties /dev/shm)
    NO_MANIFEST = "no-manifest"  # not copied by provision: nothing to check against
    DAMAGED = "damaged"  # sizes or sha256 differ from the accepted model (or the manifest), files missing / extra
    CHANGED = "changed"  # verified good files written after the service started: a restart loads them


@dataclass(frozen=True)
class ModelFile:
    size: int
    ctime: float  # seconds since the epoch


@dataclass(frozen=True)
class ModelFacts:
    path: str
    exists: bool
    manifest: ModelManifest | None
    files: dict[str, ModelFile] = field(default_factory=dict)
    hashed: dict[str, FileEntry] | None = None  # deep: every file; else the files written since `verified`
    verified: float | None = None  # the manifest's ctime: when provision last verified every file
    trusted: ModelManifest | None = None  # the model accepted on the host (opsctl.facts.trust), when recorded

    @property
    def unverified(self) -> list[str]:
        """Files written after provision verified them (or every file when that time is unknown)."""
        if self.manifest is None:
            return []
        return sorted(p for p, f in self.files.items() if self.verified is None or f.ctime > self.verified)


@dataclass(frozen=True)
class ModelVerdict:
    path: str
    problem: Problem | None
    detail: str = ""  # which files, for the one-line message

    @property
    def ok(self) -> bool:
        """NO_MANIFEST is shown but not a failure: a model copied by hand has nothing to be checked against."""
        return self.problem in (None, Problem.NO_MANIFEST)


def model_paths(service: Service) -> list[str]:
    return [m.path.rstrip("/") for m in (service.model, service.draft_model) if m is not None]


def state_cmd(unit: str, paths: Sequence[str]) -> Cmd:
    """One round trip: the unit's main-process start time, then per model its manifest (and its ctime), the
    accepted model, and every file's size and ctime. Output lines: `start <timestamp>`, `model <0|1> <path>`,
    `manifest <json on one line>`, `verified <ctime>`, `trusted <json on one line>`, `file <size> <ctime>
    <relpath>`."""
    parts = [
        f"printf 'start %s\\n' \"$(systemctl show --timestamp=us+utc -p ExecMainStartTimestamp --value "
        f'-- {shlex.quote(unit)} 2>/dev/null)"'
    ]
    for p in paths:
        q, t = shlex.quote(p), shlex.quote(trust_path(p))
        parts.append(
            f"if [ -d {q} ]; then echo 'model 1 '{q}; "
            f"if [ -f {q}/{MANIFEST_NAME} ]; then printf 'manifest '; tr -d '\\n' < {q}/{MANIFEST_NAME}; echo; "
            f"find {q}/{MANIFEST_NAME} -printf 'verified %C@\\n'; fi; "
            f"if [ -f {t} ]; then printf 'trusted '; tr -d '\\n' < {t}; echo; fi; "
            f"find {q} -type f ! -name {MANIFEST_NAME} -printf 'file %s %C@ %P\\n'; "
            f"else echo 'model 0 '{q}; fi"
        )
    return sh("; ".join(parts), sudo=True)


def parse_start(text: str) -> float | None:
    """`Tue 2026-12-01 05:30:00.123456 UTC` (systemctl --timestamp=us+utc) -> epoch seconds; None if never."""
    words = text.split()
    if len(words) < 3:
        return None
    try:
        when = datetime.strptime(f"{words[1]} {words[2]}", "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        try:
            when = datetime.strptime(f"{words[1]} {words[2]}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return None
    return when.replace(tzinfo=UTC).timestamp()


def parse_state(stdout: str) -> tuple[float | None, list[ModelFacts]]:
    """state_cmd's output -> (start time, per-model facts). Malformed lines are ignored (a fact read)."""
    start: float | None = None
    models: list[ModelFacts] = []
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "start":
            start = parse_start(rest)
        elif kind == "model" and rest[:2] in ("0 ", "1 "):
            models.append(ModelFacts(rest[2:], rest[0] == "1", None))
        elif kind == "manifest" and models:
            models[-1] = replace(models[-1], manifest=parse_manifest_json(rest))
        elif kind == "verified" and models:
            try:
                models[-1] = replace(models[-1], verified=float(rest))
            except ValueError:
                continue
        elif kind == "trusted" and models:
            trusted = parse_trusted(rest)
            models[-1] = replace(models[-1], trusted=trusted.manifest if trusted else None)
        elif kind == "file" and models:
            fields = rest.split(" ", 2)
            try:
                models[-1].files[fields[2]] = ModelFile(int(fields[0]), float(fields[1]))
            except (ValueError, IndexError):
                continue
    return start, models


def judge(facts: ModelFacts, started: float | None) -> ModelVerdict:
    """The verdict for one model directory, against the accepted model where one is recorded. DAMAGED wins:
    a corrupt file needs provision, and restarting onto it would only crash-load; CHANGED is only said of
    files whose bytes were verified (hashed) or are as provision verified them."""
    if not facts.exists:
        return ModelVerdict(facts.path, Problem.MISSING)
    newer = sorted(p for p, f in facts.files.items() if started is not None and f.ctime > started)
    changed = ModelVerdict(facts.path, Problem.CHANGED, f"{_few(newer)} written after the service started")
    if facts.manifest is None and facts.trusted is None:
        return changed if newer else ModelVerdict(facts.path, Problem.NO_MANIFEST, "not copied by provision")
    want = (facts.trusted or facts.manifest or ModelManifest({})).files
    wrong = sorted(p for p, e in want.items() if p in facts.files and facts.files[p].size != e.size)
    if facts.hashed is not None:
        wrong = sorted(set(wrong) | {p for p, e in facts.hashed.items() if p in want and want[p] != e})
    missing = sorted(set(want) - set(facts.files))
    extra = sorted(set(facts.files) - set(want))
    if wrong or missing or extra:
        detail = "; ".join(
            f"{label} {_few(names)}"
            for label, names in (("differ from the manifest:", wrong), ("missing:", missing), ("extra:", extra))
            if names
        )
        written = sorted(set(wrong) & set(facts.unverified))
        if written:
            detail += f" ({_few(written)} written after provision verified it)"
        return ModelVerdict(facts.path, Problem.DAMAGED, detail)
    if facts.trusted is not None and facts.manifest is not None and facts.manifest.files != facts.trusted.files:
        return ModelVerdict(facts.path, Problem.DAMAGED, "its manifest is not the model accepted on the host")
    return changed if newer else ModelVerdict(facts.path, None)


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check(
    remote: Connection, service: Service, unit: str, deep: bool = False, host: Host | None = None
) -> list[ModelVerdict]:
    """Every model of the service, judged (deep: sha256 of every file too, which reads the whole model).
    `host`: where the host has no record of the accepted model (lost), the control machine's copy of it
    (read_local) is the reference."""
    paths = model_paths(service)
    if not paths:
        return []
    started, models = parse_state(remote.run(state_cmd(unit, paths), timeout=120).stdout)
    verdicts = []
    for facts in models:
        kept = read_local(host, facts.path) if host is not None and facts.trusted is None else None
        if kept is not None:
            facts = replace(facts, trusted=kept.manifest)
        if deep and facts.exists and facts.manifest is not None:
            listing = remote.run(hash_listing_cmd(facts.path), timeout=3600, check=False).stdout
            facts = replace(facts, hashed=parse_hash_listing(listing))
        elif facts.exists and facts.unverified:
            names = facts.unverified
            listing = remote.run(files_hash_cmd(facts.path, names), timeout=3600, check=False).stdout
            facts = replace(facts, hashed=parse_files_hash(listing, facts.files))
        verdicts.append(judge(facts, started))
    return verdicts


def files_hash_cmd(directory: str, names: Sequence[str]) -> Cmd:
    """sha256 of these files only (coreutils; `<sha256>  <relpath>` per line), from inside `directory`."""
    return sh(f"cd {shlex.quote(directory)} && sha256sum -- {shlex.join(names)}", sudo=True)


def parse_files_hash(stdout: str, files: dict[str, ModelFile]) -> dict[str, FileEntry]:
    """files_hash_cmd's output -> entries (with the sizes listed); a line it cannot read is left out."""
    found: dict[str, FileEntry] = {}
    for line in stdout.splitlines():
        digest, sep, name = line[:64], line[64:66], line[66:]
        if sep == "  " and len(digest) == 64 and name in files:
            found[name] = FileEntry(files[name].size, digest)
    return found


def fix_hint(
    verdict: ModelVerdict, host: str, service: str, restore_unit: str | None = None, restore_failed: str = ""
) -> str:
    """The one command that fixes what remains, per problem. `restore_failed`: the boot-time restore unit's
    result when it failed (starting it again fails again: provision names what is wrong with the source)."""
    provision = f"`opsctl provision -i INVENTORY --host {host}` (copies it back, then restarts the services using it)"
    if verdict.problem is Problem.MISSING and restore_unit and restore_failed:
        return (
            f"its restore unit {restore_unit} failed ({restore_failed}; `journalctl -b -u {restore_unit}` on the "
            f"host says why): `opsctl provision -i INVENTORY --host {host}` copies it back, or refuses a source "
            "that is not the accepted model and says what differs"
        )
    if verdict.problem is Problem.MISSING and restore_unit:
        return f"`systemctl start {restore_unit}` on the host, or {provision}"
    if verdict.problem is Problem.CHANGED:
        return (
            f"they match the accepted sha256; restart the service to load them: `opsctl provision -i INVENTORY "
            f"--host {host}` restarts the services whose model changed"
        )
    return provision


def describe(verdict: ModelVerdict) -> str:
    what = {
        Problem.MISSING: "not on the host (a reboot empties /dev/shm)",
        Problem.NO_MANIFEST: "has no provision manifest",
        Problem.DAMAGED: "is corrupt: it does not match its manifest",
        Problem.CHANGED: "changed under the running service",
    }
    text = f"model {verdict.path} {what[verdict.problem]}" if verdict.problem else f"model {verdict.path} ok"
    return f"{text} ({verdict.detail})" if verdict.detail else text


def restore_unit(spec: ModelSpec) -> str:
    """The boot-time restore unit of a host-side model (opsctl.ops.model_restore installs it)."""
    return f"opsctl-model-{model_name(spec.path)}.service"


def failed_restore_units(remote: Connection, specs: Sequence[ModelSpec]) -> dict[str, str]:
    """Restore unit -> its result, for those of these models' restore units that failed (host-side models only:
    a control-side model has none). Starting a failed one again fails again; provision says why."""
    out = {}
    for spec in specs:
        if spec.source_on is not ModelSourceKind.HOST:
            continue
        unit = restore_unit(spec)
        state = systemd.parse_show(remote.run(systemd.show_cmd(unit), check=False).stdout)
        if state.active_state == "failed" or state.result not in ("success", ""):
            out[unit] = state.result or state.active_state
    return out
