"""Checks a deploy or rollback makes before it changes anything, each returning facts or one-line refusals:
old secrets on a rollback target, abandoned (incomplete) releases, free disk space, models that are corrupt
or changed under the running service. Kept out of flow.py so each rule stays one small, testable function."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from opsctl.commands import Cmd, sh
from opsctl.deploy import release, secret_fp
from opsctl.errors import DeployError, FactError, OpsctlError
from opsctl.facts import modelcheck
from opsctl.facts.system import parse_df, size_iec

if TYPE_CHECKING:
    from opsctl.deploy.context import ServiceContext
    from opsctl.deploy.release import ServicePaths
    from opsctl.inventory.model import Service
    from opsctl.remote.base import Connection

# A release is a few small files plus the runtime installed with `pip --target` (~1-5 MB); pip also needs
# room for its temporary unpacking. Below this much free space, staging is refused before it starts.
MIN_FREE_BYTES = 256 << 20
ERROR_TEXT_MAX = 300  # characters of a remote error kept in a message, the audit log and the BAD file


def bounded(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """One line, at most about `limit` characters: a failing command's output can be many kilobytes. Keeps
    both ends: the start says which command, the end holds the actual error."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    head, tail = limit // 2, limit // 2 - 30
    return f"{line[:head]} ... [{len(line) - head - tail} chars cut] ... {line[-tail:]}"


def secrets_differ(stored_fp: str | None, secrets: dict[str, str]) -> bool:
    """Whether a release was deployed with other secrets than the inventory's current ones. A release without a
    fingerprint counts as different when there are secrets now (it may serve no key, or an old one), and one
    with a fingerprint counts as different when there are none now."""
    if not secrets:
        return bool(stored_fp and stored_fp.strip())
    return secret_fp.matches(stored_fp or "", secrets) is not True


def check_rollback_secrets(ctx: ServiceContext, target: str, secrets: dict[str, str]) -> None:
    """Refuse a rollback that would bring back an older API key (the one rotated away from)."""
    try:
        stored: str | None = ctx.conn.get_text(ctx.paths.release_file(target, secret_fp.FP_FILE))
    except OpsctlError:
        stored = None
    if secrets_differ(stored, secrets):
        host, svc = ctx.host.name, ctx.service.name
        raise DeployError(
            f"{host}/{svc}: {target} was deployed with a different API key than the inventory's current one; "
            "rolling back would serve the old key again; nothing was changed",
            "roll back anyway with `opsctl rollback --allow-old-secrets`, or deploy the fix with the current key",
        )


class _Releases(Protocol):
    """A target's releases on its host (a service's or a router's)."""

    @property
    def paths(self) -> ServicePaths: ...

    def run(self, cmd: Cmd, check: bool = True) -> str: ...


def mark_incomplete(target: _Releases, facts: release.ReleaseFacts) -> list[str]:
    """Releases whose staging never finished (no manifest, no BAD: a host that went away mid-staging, a killed
    opsctl) are marked BAD. Called under the host's lock, so none of them is being staged right now."""
    abandoned = [r.release_id for r in facts.releases if not r.complete and not r.bad and r.release_id != facts.current]
    for rid in abandoned:
        target.run(release.mark_bad_cmd(target.paths, rid, "incomplete: staging never finished"), check=False)
    return abandoned


def check_free_space(conn: Connection, host: str, paths: ServicePaths, need: int = MIN_FREE_BYTES) -> None:
    """Refuse to stage into a filesystem without room: a full disk mid-staging leaves a half-written release."""
    root = paths.releases  # where staging writes (its own filesystem, possibly)
    out = conn.run(
        sh(f"mkdir -p {shlex.quote(root)} && df -P -B1 {shlex.quote(root)}", sudo=True), check=False, timeout=60
    )
    try:
        space = parse_df(out.stdout)
    except FactError:
        return  # cannot tell; staging itself will say what is wrong
    if space.available < need:
        raise DeployError(
            f"{host}: only {size_iec(space.available)} free in {space.mount} ({root}), "
            f"a release needs {size_iec(need)}; nothing was changed",
            f"free space on {space.mount} (old releases in {paths.releases}, logs, caches), then deploy again",
        )


def model_verdicts(ctx: ServiceContext) -> list[modelcheck.ModelVerdict]:
    """Every model of the service against the model accepted on the host; hashes only the files written since
    provision verified them (none, normally)."""
    return modelcheck.check(ctx.conn, ctx.service, ctx.paths.unit_name, host=ctx.host)


def models_changed(verdicts: list[modelcheck.ModelVerdict]) -> list[modelcheck.ModelVerdict]:
    """Verified good model files written after the running service started: a restart loads them."""
    return [v for v in verdicts if v.problem is modelcheck.Problem.CHANGED]


def refuse_damaged(ctx: ServiceContext, verdicts: list[modelcheck.ModelVerdict]) -> None:
    """Refuse before anything restarts: a new release (and its rollback target) would crash loading a corrupt
    model, turning a degraded service into an outage and marking a good config BAD."""
    damaged = [v for v in verdicts if v.problem is modelcheck.Problem.DAMAGED]
    if damaged:
        host, svc = ctx.host.name, ctx.service.name
        raise DeployError(
            f"{host}/{svc}: {modelcheck.describe(damaged[0])}; a restart would load it, so nothing was changed",
            modelcheck.fix_hint(damaged[0], host, svc),
        )


def missing_hint(host: str, missing: list[str], failed_restores: Mapping[str, str] | None = None) -> str:
    """The one command that brings missing models back (and restarts the services that use them). When a model's
    boot-time restore unit failed, its source is what failed: provision then names what is wrong with it."""
    provision = f"`opsctl provision -i INVENTORY --host {host}`"
    if failed_restores:
        units = ", ".join(f"{unit} ({result})" for unit, result in failed_restores.items())
        first = next(iter(failed_restores))
        return (
            f"the restore unit failed at boot: {units}; `journalctl -b -u {first}` on the host says why; {provision} "
            f"copies {', '.join(missing)} back, or refuses a source that is not the accepted model and says what "
            "differs"
        )
    return f"{provision} copies {', '.join(missing)} back and restarts the services using it; nothing else is needed"


def failed_restores(conn: Connection, service: Service, missing: list[str]) -> dict[str, str]:
    """The failed restore units of the service's missing models ."""
    gone = {m.rstrip("/") for m in missing}
    specs = [m for m in (service.model, service.draft_model) if m is not None and m.path.rstrip("/") in gone]
    return modelcheck.failed_restore_units(conn, specs)


def space_hint(exc: OpsctlError) -> str | None:
    """A hint about space when a staging command failed because the disk is full."""
    text = f"{exc.message} {getattr(exc, 'tail', '')}"
    if "No space left on device" in text or "Disk quota exceeded" in text:
        return "the host's disk is full: free space under /opt/opsctl (old releases, logs, caches), then deploy again"
    return None
