"""model_restore: per model whose source lives on the host, a oneshot systemd unit that copies it back into
/dev/shm at boot, before the services that use it start, verified against provision's manifest.

/dev/shm is emptied by every reboot; without this, each service crash-loops until an operator runs
provision. The unit (`opsctl-model-<name>.service`) is `RequiredBy=` and `Before=` every service using the
model: the service starts only once its model is whole, and a failed restore shows as that unit failing, not
as a crash loop. It runs one shared script (`/opt/opsctl/bin/opsctl-restore-model`) with the source, the
final path and its state dir (`/var/lib/opsctl/models/<name>/`: the manifest and a `sha256sum -c` list, both
written from the model accepted on the host, opsctl.ops.model_trust, never from what /dev/shm holds now).
Same copy protocol as model_sync: a staging dir, checked, then renamed into place. The script is a no-op
when the final path already carries the same manifest (a unit restart rather than a boot).

Models whose source is on the control machine cannot be restored by the host alone: `opsctl status` reports
them after a reboot with the command that restores them (provision). A restore unit on the host that no
service needs any more (its model's source moved to the control machine, or its services went) is disabled and
removed with its restore files (`plan_removal`; the accepted manifest stays): left enabled, it would
copy an old source over the model at boot.
"""

from __future__ import annotations

import posixpath
import re
import shlex

from opsctl import layout, systemd
from opsctl.commands import Cmd, sh
from opsctl.facts import modelcheck, trust
from opsctl.facts.manifest import Manifest
from opsctl.inventory.model import Host, ModelSourceKind, ModelSpec
from opsctl.ops import model_trust
from opsctl.ops.base import Action, Context, Plan, PutText, execute, read
from opsctl.ops.model_sync import model_users
from opsctl.systemd import escape_specifiers, quote_exec

NAME = "model_restore"
SCRIPT = "/opt/opsctl/bin/opsctl-restore-model"

SCRIPT_TEXT = """\
#!/bin/sh
# Written by `opsctl provision` (model_restore); run by opsctl-model-*.service at boot.
# Usage: opsctl-restore-model SOURCE FINAL STATE_DIR. Copies SOURCE into FINAL (under /dev/shm) through a
# staging dir checked against STATE_DIR/sha256sums, then renames it into place; a no-op when FINAL already
# carries the manifest in STATE_DIR.
set -eu
src=$1; final=$2; state=$3
if cmp -s "$state/manifest.json" "$final/.opsctl-manifest.json" 2>/dev/null; then
    echo "$final: present, nothing to restore"; exit 0
fi
parent=$(dirname "$final"); name=$(basename "$final")
staging="$parent/.opsctl-sync-$name"; old="$parent/.opsctl-old-$name"
trap 'rm -rf "$staging"' EXIT
rm -rf "$staging" "$old"
mkdir -p "$staging"
cp -a "$src/." "$staging/"
(cd "$staging" && sha256sum --quiet --strict -c "$state/sha256sums")
cp "$state/manifest.json" "$staging/.opsctl-manifest.json"
if [ -e "$final" ]; then mv -T "$final" "$old"; fi
mv -T "$staging" "$final"
trap - EXIT
rm -rf "$old"
echo "$final: restored from $src and verified"
"""


def model_name(spec: ModelSpec) -> str:
    return trust.model_name(spec.path)


def state_dir(spec: ModelSpec) -> str:
    return trust.state_dir(spec)


def users(host: Host, spec: ModelSpec) -> list[str]:
    """Unit names of the host's services that use this model (as model or draft model)."""
    return model_users(host, [spec])


def restorable(host: Host) -> list[ModelSpec]:
    """Distinct host-side models of the host's services (control-side ones cannot be restored on the host)."""
    seen: dict[str, ModelSpec] = {}
    for svc in host.services:
        for spec in (svc.model, svc.draft_model):
            if spec is not None and spec.source_on is ModelSourceKind.HOST:
                seen.setdefault(spec.path.rstrip("/"), spec)
    return list(seen.values())


def unit_text(spec: ModelSpec, services: list[str]) -> str:
    argv = (SCRIPT, spec.source.rstrip("/"), spec.path.rstrip("/"), state_dir(spec))
    wanted = " ".join(services)
    return "\n".join(
        [
            f"# Written by `opsctl provision` (model_restore): {spec.path} from {spec.source} after a boot.",
            "[Unit]",
            f"Description={escape_specifiers(f'opsctl: restore {spec.path} from {spec.source}')}",
            "After=local-fs.target",
            f"Before={wanted}",
            "",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            "ExecStart=" + " ".join(quote_exec(a) for a in argv),
            "TimeoutStartSec=3600",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            f"RequiredBy={wanted}",
            "",
        ]
    )


sums_text = model_trust.sums_text


def desired_files(spec: ModelSpec, manifest: Manifest, services: list[str]) -> dict[str, tuple[str, int]]:
    """remote path -> (content, mode) of everything the restore of one model needs."""
    state = state_dir(spec)
    return {
        SCRIPT: (SCRIPT_TEXT, 0o755),
        f"{state}/manifest.json": (manifest.to_json(), 0o644),
        f"{state}/sha256sums": (sums_text(manifest), 0o644),
        f"{layout.UNIT_DIR}/{modelcheck.restore_unit(spec)}": (unit_text(spec, services), 0o644),
    }


def plan_restore(
    spec: ModelSpec, manifest: Manifest | None, services: list[str], have: dict[str, str], enabled: bool
) -> tuple[list[Action], list[str]]:
    """The pure decision for one model: write what differs, then (re)enable the unit."""
    if manifest is None:
        return [], [f"{spec.path}: no accepted model yet (model_sync records it); restore unit not written"]
    writes: list[Action] = [
        PutText(path, text, mode) for path, (text, mode) in desired_files(spec, manifest, services).items()
        if have.get(path) != text
    ]  # fmt: skip
    if not writes and enabled:
        return [], [f"{spec.path}: restored at boot by {modelcheck.restore_unit(spec)}"]
    dirs = sorted({posixpath.dirname(a.remote) for a in writes if isinstance(a, PutText)})
    actions: list[Action] = [Cmd.of("mkdir", "-p", *dirs, sudo=True)] if dirs else []
    actions += writes
    actions += [
        systemd.daemon_reload_cmd(),
        systemd.reenable_cmd(modelcheck.restore_unit(spec)),
    ]
    return actions, [f"{spec.path}: install {modelcheck.restore_unit(spec)} (copies {spec.source} back after a reboot)"]


_UNIT_FILE = re.compile(r"opsctl-model-([A-Za-z0-9_.-]+)\.service")


def installed_cmd() -> Cmd:
    """A fact read: the restore unit files on the host, one name a line."""
    return sh(f"ls -1 {shlex.quote(layout.UNIT_DIR)} 2>/dev/null | grep -E '^opsctl-model-.*[.]service$' || true")


def parse_installed(stdout: str) -> list[str]:
    return sorted({line.strip() for line in stdout.splitlines() if _UNIT_FILE.fullmatch(line.strip())})


def plan_removal(installed: list[str], wanted: set[str]) -> tuple[list[Action], list[str]]:
    """The pure decision: disable and remove every installed restore unit not in `wanted`. Disabled before
    anything stops it: a service `Requires=` its restore unit (RequiredBy), so stopping it first would stop
    the service; once disabled and reloaded, the stop touches nothing else."""
    stale = [u for u in installed if u not in wanted]
    actions: list[Action] = []
    for unit in stale:
        name = unit.removeprefix("opsctl-model-").removesuffix(".service")  # as state_dir names it
        actions += [
            Cmd.of("systemctl", "disable", "--quiet", "--", unit, sudo=True),
            Cmd.of("rm", "-f", "--", f"{layout.UNIT_DIR}/{unit}", sudo=True),
            # the restore's own files only: the state dir also holds the model's accepted manifest
            # (model_trust's trusted.json), which outlives where the model's source lives
            Cmd.of(
                "rm",
                "-f",
                "--",
                f"{trust.STATE_ROOT}/{name}/manifest.json",
                f"{trust.STATE_ROOT}/{name}/sha256sums",
                sudo=True,
            ),
        ]
    if stale:
        actions.append(systemd.daemon_reload_cmd())
        actions += [sh(f"systemctl stop -- {shlex.quote(u)} 2>/dev/null || true", sudo=True) for u in stale]
    notes = [f"{u}: no service here restores that model from a host-side source now: disable and remove" for u in stale]
    return actions, notes


class ModelRestore:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        actions: list[Action] = []
        notes: list[str] = []
        for spec in restorable(ctx.spec):
            trusted = trust.read_trusted(ctx.remote, spec.path)
            manifest = trusted.manifest if trusted is not None else None
            services = users(ctx.spec, spec)
            have = {}
            if manifest is not None:
                for path in desired_files(spec, manifest, services):
                    out = read(ctx.remote, Cmd.of("cat", path))
                    have[path] = out.stdout if out.exit_code == 0 else ""
            enabled = read(ctx.remote, systemd.is_enabled_cmd(modelcheck.restore_unit(spec)))
            acts, why = plan_restore(spec, manifest, services, have, enabled.exit_code == 0)
            actions += acts
            notes += why
        wanted = {modelcheck.restore_unit(spec) for spec in restorable(ctx.spec)}
        removal, why = plan_removal(parse_installed(read(ctx.remote, installed_cmd()).stdout), wanted)
        actions += removal
        notes += why
        if not restorable(ctx.spec):
            notes.append("no host-side model sources (control-side ones come back with `opsctl provision`)")
        return Plan(NAME, actions=tuple(actions), notes=tuple(notes))

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions)
        return Plan(NAME, notes=plan.notes)


def restore_cmd(spec: ModelSpec) -> str:
    """What an operator runs on the host to restore one model now (shown by status)."""
    return shlex.join(["systemctl", "start", modelcheck.restore_unit(spec)])
