"""Releases: ids, host layout, manifest, the commands that read and change a host's releases, their
parsers, and pruning. Pure (values, commands and parsers), except `missing_models`, which runs one read-only
command through the connection it is given.

A release id is `<UTC time>-<config hash>` (`20261129T221500Z-3f9c0a1b2c4d`): it sorts by time, and the hash
says whether two releases carry the same configuration, so an unchanged deploy is detected from the id alone.
The hash covers the rendered files, the argv, the runtime wheel's sha256 and the model manifests, rendered with
a placeholder id so it does not depend on the id it is part of (see opsctl.deploy.staged).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from opsctl import layout
from opsctl.commands import Cmd, sh
from opsctl.errors import DeployError
from opsctl.inventory.model import Service
from opsctl.remote.base import Connection

PLACEHOLDER_ID = "00000000T000000Z-000000000000"  # used to render for hashing (same length as real ids)
HASH_LEN = 12
_ID = re.compile(r"^(\d{8}T\d{6}Z)-([0-9a-f]{12})$")
BAD_MARKER = "BAD"  # a file in a release dir: the release failed its gates; its content says why
# A file in a release dir from the switch until its gates passed: a release that has it and is current was
# never tested (the host rebooted, opsctl was killed mid-gate); the next deploy finishes its gates or rolls back,
# status fails, and it is nobody's rollback target.
PENDING_MARKER = "GATES_PENDING"
MANIFEST = "manifest.json"
PREVIOUS = "previous"  # a file in a release dir: the release that served when this one was deployed
DEFAULT_KEEP = 5


def config_hash(files: Mapping[str, str], argv: tuple[str, ...], runtime_sha256: str, models: str = "") -> str:
    """Stable hash of everything that defines a release (files by name, argv, runtime wheel, and the model
    manifests on the host, so new weights at the same path make a new release and a restart)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"file {name} {len(files[name])}\n".encode())
        digest.update(files[name].encode())
    digest.update(("argv " + "\0".join(argv) + "\n").encode())
    digest.update(f"runtime {runtime_sha256}\n".encode())
    if models:
        digest.update(f"models {models}\n".encode())
    return digest.hexdigest()[:HASH_LEN]


def new_release_id(now: datetime, chash: str) -> str:
    if len(chash) != HASH_LEN:
        raise ValueError(f"config hash must be {HASH_LEN} hex chars: {chash!r}")
    return f"{now.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}-{chash}"


def unused_release_id(now: datetime, chash: str, existing: set[str]) -> str:
    """A new id that names no existing release: a forced or key-rotating redeploy within the same second as the
    release it replaces would otherwise reuse (and overwrite) that release's directory."""
    candidate = new_release_id(now, chash)
    while candidate in existing:
        now += timedelta(seconds=1)
        candidate = new_release_id(now, chash)
    return candidate


@dataclass(frozen=True, order=True)
class ReleaseId:
    time: datetime
    chash: str

    @staticmethod
    def parse(text: str) -> ReleaseId:
        match = _ID.match(text)
        if not match:
            raise DeployError(f"not a release id: {text!r}", "release ids look like 20261129T221500Z-3f9c0a1b2c4d")
        when = datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        return ReleaseId(when, match.group(2))

    def __str__(self) -> str:
        return new_release_id(self.time, self.chash)


def is_release_id(text: str) -> bool:
    return bool(_ID.match(text))


@dataclass(frozen=True)
class ServicePaths:
    """Where one service's releases live on its host."""

    service: str

    @property
    def root(self) -> str:
        return layout.service_root(self.service)

    @property
    def releases(self) -> str:
        return layout.releases_dir(self.service)

    @property
    def current(self) -> str:
        return layout.current_link(self.service)

    @property
    def unit_name(self) -> str:
        return layout.unit_name(self.service)

    @property
    def installed_unit(self) -> str:
        return layout.unit_path(self.service)

    def release(self, release_id: str) -> str:
        return layout.release_dir(self.service, release_id)

    def release_unit(self, release_id: str) -> str:
        # Named like the unit so `systemd-analyze verify` accepts it as a .service file.
        return f"{self.release(release_id)}/{self.unit_name}"

    def release_file(self, release_id: str, name: str) -> str:
        return f"{self.release(release_id)}/{self.unit_name if name == 'unit' else name}"

    def site(self, release_id: str) -> str:
        return f"{self.release(release_id)}/site"


@dataclass(frozen=True)
class Manifest:
    """manifest.json of a release: what it is; written last, once staging (pre-flight and `systemd-analyze
    verify` included) succeeded, so a release with a manifest is complete."""

    release_id: str
    service: str
    host: str
    mode: str
    engine: str
    config_hash: str
    created_at: str  # ISO 8601 UTC
    runtime_wheel: str  # file name of the installed ddtree-runtime wheel
    runtime_sha256: str
    runtime_version: str
    opsctl_version: str
    argv: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256 of the content

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @staticmethod
    def from_json(text: str) -> Manifest:
        try:
            data = json.loads(text)
            data["argv"] = tuple(data.get("argv", ()))
            return Manifest(**data)
        except (ValueError, TypeError, KeyError) as exc:
            raise DeployError(f"unreadable release manifest: {exc}", "the release dir may be damaged") from None


def file_digests(files: Mapping[str, str]) -> dict[str, str]:
    return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sorted(files.items())}


# ---------------------------------------------------------------- facts read from the host


@dataclass(frozen=True)
class ReleaseEntry:
    release_id: str
    bad: bool
    complete: bool  # manifest.json present (staging finished)
    pending: bool = False  # switched to, its gates never finished (PENDING_MARKER)

    @property
    def good(self) -> bool:
        """A release that may serve again: complete, not BAD, and it passed its gates."""
        return self.complete and not self.bad and not self.pending


@dataclass(frozen=True)
class ReleaseFacts:
    current: str | None  # the release id `current` points to
    releases: tuple[ReleaseEntry, ...]  # sorted oldest first
    deployed_over: str | None = None  # the release that served when `current` was deployed (its PREVIOUS file)

    @property
    def current_hash(self) -> str | None:
        return self.current.rsplit("-", 1)[1] if self.current and is_release_id(self.current) else None

    def entry(self, release_id: str) -> ReleaseEntry | None:
        return next((r for r in self.releases if r.release_id == release_id), None)

    @property
    def current_pending(self) -> bool:
        """`current` was switched to and its gates never finished."""
        entry = self.entry(self.current) if self.current else None
        return entry is not None and entry.pending and not entry.bad

    def previous_good(self, before: str | None = None) -> str | None:
        """The newest complete, not-bad release older than `before` (default: current)."""
        limit = before if before is not None else self.current
        candidates = [
            r.release_id
            for r in self.releases
            if r.good and r.release_id != limit and (limit is None or r.release_id < limit)
        ]
        return candidates[-1] if candidates else None

    def rollback_target(self) -> str | None:
        """What served before `current` was deployed, when still good; else the newest good older release.

        Newest-older alone is wrong after a rollback: deploy A, B, roll back to A, deploy C; rolling back C
        must restore A, not B (which the operator already rolled away from).
        """
        prior = self.entry(self.deployed_over) if self.deployed_over else None
        if prior is not None and prior.good and prior.release_id != self.current:
            return prior.release_id
        return self.previous_good()


def facts_cmd(paths: ServicePaths) -> Cmd:
    """One round trip: where `current` points and every release with its bad/complete/pending flags."""
    script = (
        f'cur=$(readlink {shlex.quote(paths.current)} 2>/dev/null || true); echo "current $cur"; '
        f'echo "previous $(cat {shlex.quote(paths.current)}/{PREVIOUS} 2>/dev/null || true)"; '
        f'for d in {shlex.quote(paths.releases)}/*/; do [ -d "$d" ] || continue; '
        'id=$(basename "$d"); b=0; c=0; p=0; '
        f'[ -e "${{d}}{BAD_MARKER}" ] && b=1; [ -e "${{d}}{MANIFEST}" ] && c=1; '
        f'[ -e "${{d}}{PENDING_MARKER}" ] && p=1; '
        'echo "release $id $b $c $p"; done'
    )
    return sh(script, sudo=True)


def parse_release_facts(stdout: str) -> ReleaseFacts:
    """Parse facts_cmd output. Unknown lines and non-release directories are ignored."""
    current: str | None = None
    deployed_over: str | None = None
    entries: list[ReleaseEntry] = []
    for line in stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "current":
            target = parts[1] if len(parts) > 1 else ""
            name = target.rstrip("/").rsplit("/", 1)[-1]
            current = name if is_release_id(name) else None
        elif parts[0] == "previous":
            deployed_over = parts[1] if len(parts) == 2 and is_release_id(parts[1]) else None
        elif parts[0] == "release" and len(parts) in (4, 5) and is_release_id(parts[1]):
            pending = len(parts) == 5 and parts[4] == "1"  # 4 fields: an opsctl from before the marker
            entries.append(ReleaseEntry(parts[1], parts[2] == "1", parts[3] == "1", pending))
    entries.sort(key=lambda e: e.release_id)
    return ReleaseFacts(current, tuple(entries), deployed_over)


# ---------------------------------------------------------------- commands


def switch_cmd(paths: ServicePaths, release_id: str) -> Cmd:
    """Point `current` at a release atomically: a new symlink, then rename over the old one (mv -T)."""
    tmp = f"{paths.current}.tmp"
    return sh(
        f"ln -sfn releases/{shlex.quote(release_id)} {shlex.quote(tmp)} && mv -T {shlex.quote(tmp)} "
        f"{shlex.quote(paths.current)}",
        sudo=True,
    )


def install_unit_cmd(paths: ServicePaths, release_id: str) -> Cmd:
    return Cmd.of("install", "-m", "0644", paths.release_unit(release_id), paths.installed_unit, sudo=True)


def pip_install_cmd(venv: str, wheel_path: str, site: str) -> Cmd:
    """The runtime into the release's own site dir; its dependencies come from the shared venv."""
    return Cmd.of(
        f"{venv}/bin/python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        "--disable-pip-version-check",
        "--target",
        site,
        wheel_path,
        sudo=True,
    )


def mark_bad_cmd(paths: ServicePaths, release_id: str, reason: str) -> Cmd:
    marker = f"{paths.release(release_id)}/{BAD_MARKER}"
    return sh(f"printf '%s\\n' {shlex.quote(reason)} > {shlex.quote(marker)}", sudo=True)


def mark_pending_cmd(paths: ServicePaths, release_id: str) -> Cmd:
    """Before the switch: the release goes live untested until clear_pending_cmd."""
    return Cmd.of("touch", "--", f"{paths.release(release_id)}/{PENDING_MARKER}", sudo=True)


def clear_pending_cmd(paths: ServicePaths, release_id: str) -> Cmd:
    """The release passed its gates."""
    return Cmd.of("rm", "-f", "--", f"{paths.release(release_id)}/{PENDING_MARKER}", sudo=True)


def clear_bad_cmd(paths: ServicePaths, release_id: str) -> Cmd:
    """A BAD release went back into service with --force and passed its gates."""
    return Cmd.of("rm", "-f", "--", f"{paths.release(release_id)}/{BAD_MARKER}", sudo=True)


def bad_reason_cmd(paths: ServicePaths, release_id: str) -> Cmd:
    """Why a release was marked BAD (the marker's content)."""
    return Cmd.of("cat", "--", f"{paths.release(release_id)}/{BAD_MARKER}", sudo=True)


def remove_releases_cmd(paths: ServicePaths, release_ids: list[str]) -> Cmd:
    return Cmd.of("rm", "-rf", "--", *[paths.release(r) for r in release_ids], sudo=True)


def plan_prune(facts: ReleaseFacts, keep: int, protect: tuple[str, ...] = ()) -> list[str]:
    """Release ids to delete: all but the `keep` newest good ones (complete, not BAD: BAD and incomplete
    releases are no rollback target, so they never take a good one's place), never current, its rollback
    target, nor `protect`."""
    if keep < 1:
        raise DeployError(f"keep_releases must be >= 1, got {keep}")
    ids = [r.release_id for r in facts.releases]
    good = [r.release_id for r in facts.releases if r.complete and not r.bad]
    keep_set = set(good[-keep:]) | set(protect)
    if facts.current:
        keep_set.add(facts.current)
    if facts.deployed_over:
        keep_set.add(facts.deployed_over)
    return [r for r in ids if r not in keep_set]


MODEL_MANIFEST = ".opsctl-manifest.json"  # written by provision's model_sync next to the weights


def model_manifests_cmd(model_paths: list[str]) -> Cmd:
    """sha256 of each model's manifest on the host (missing ones print nothing)."""
    files = " ".join(shlex.quote(f"{p.rstrip('/')}/{MODEL_MANIFEST}") for p in model_paths)
    return sh(f"sha256sum {files} 2>/dev/null || true", sudo=True)


def missing_models_cmd(model_paths: list[str]) -> Cmd:
    """Print each model directory that has no config.json on the host."""
    checks = [f"test -f {shlex.quote(p.rstrip('/') + '/config.json')} || echo {shlex.quote(p)}" for p in model_paths]
    return sh("; ".join(checks) + "; true", sudo=True)


def missing_models(remote: Connection, service: Service) -> list[str]:
    """The service's model directories that are not on the host (after a reboot /dev/shm is empty)."""
    paths = [m.path for m in (service.model, service.draft_model) if m is not None]
    return remote.run(missing_models_cmd(paths)).stdout.split() if paths else []


def parse_model_manifests(stdout: str, model_paths: list[str]) -> str:
    """`path=sha` for each model in order; `path=none` when the host has no manifest for it."""
    found = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            found[parts[1].rsplit("/", 1)[0]] = parts[0]
    return ";".join(f"{p.rstrip('/')}={found.get(p.rstrip('/'), 'none')}" for p in model_paths)
