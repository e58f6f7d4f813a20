"""model_trust: each model's accepted (known-good) manifest on its host, as SSH's known_hosts holds host keys.

Trust on first use: the first provision that copies a model (or finds it verified in place) records the
source's manifest (size and sha256 per file) as accepted, in `/var/lib/opsctl/models/<name>/trusted.json` on
the host (it survives the reboots that empty /dev/shm). After that, only an explicit act changes it:
`opsctl provision --accept-model PATH`. Every source is judged against it before anything is copied, so a
corrupted source (host-side or on the control machine) is refused with what differs: it is never copied,
never written into the model's manifest or the restore unit's sha256sums. Deploy, rollback and status judge
the copy in /dev/shm against the same record (opsctl.modelcheck).

The control machine keeps a copy of each host's record, `$XDG_STATE_HOME/opsctl/trust/<host>@<address>/
<name>.json` (default ~/.local/state), written whenever the host's is: a host whose record was lost (its disk
replaced, /var/lib wiped) still has its model remembered, a corrupt source is still refused, and the record is
written back. A host record that differs from the control machine's copy is refused (`reconcile`) until the
operator says which is right with the one explicit act, `--accept-model`.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from opsctl import localfiles
from opsctl.commands import Cmd
from opsctl.inventory.model import Host, ModelSpec
from opsctl.ops.base import KeepLocal, read
from opsctl.ops.facts.manifest import MANIFEST_NAME, FileEntry, Manifest, compare, parse_manifest_json
from opsctl.remote.base import Connection

STATE_ROOT = "/var/lib/opsctl/models"
TRUST_FILE = "trusted.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def model_name(path: str) -> str:
    """The model's name on the host (its state dir, its restore unit): the destination's basename, made safe."""
    return _UNSAFE.sub("_", posixpath.basename(path.rstrip("/")))


def state_dir(spec: ModelSpec) -> str:
    return f"{STATE_ROOT}/{model_name(spec.path)}"


def trust_path(model_path: str) -> str:
    return f"{STATE_ROOT}/{model_name(model_path)}/{TRUST_FILE}"


def digest(manifest: Manifest) -> str:
    """One fingerprint of the whole model (sizes and sha256 of every file), shown like an SSH key's."""
    return "sha256:" + hashlib.sha256(manifest.to_json().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Trusted:
    manifest: Manifest
    accepted_at: str  # when it was recorded (UTC, ISO 8601)
    how: str  # "first use", "accepted" or "earlier manifest": which act recorded it
    recorded: bool = True  # False: taken from an earlier provision's manifest, recorded on this run

    def describe(self) -> str:
        return f"{digest(self.manifest)} ({self.how}" + (f" at {self.accepted_at})" if self.accepted_at else ")")

    def to_json(self) -> str:
        files = {p: {"size": e.size, "sha256": e.sha256} for p, e in sorted(self.manifest.files.items())}
        body = {"version": 1, "digest": digest(self.manifest), "accepted_at": self.accepted_at, "how": self.how}
        return json.dumps({**body, "files": files}, indent=1, sort_keys=True) + "\n"


def parse_trusted(text: str) -> Trusted | None:
    """None when absent or unreadable: a record that cannot be read protects nothing, and says so (status)."""
    if not text.strip():
        return None
    try:
        body = json.loads(text)
        files = {str(p): FileEntry(int(e["size"]), str(e["sha256"])) for p, e in body["files"].items()}
        return Trusted(Manifest(files), str(body.get("accepted_at", "")), str(body.get("how", "")))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def sums_text(manifest: Manifest) -> str:
    """The restore unit's `sha256sum -c` list of a manifest."""
    return "".join(f"{e.sha256}  {path}\n" for path, e in sorted(manifest.files.items()))


def record_files(spec: ModelSpec, record: Trusted, restorable: bool) -> dict[str, str]:
    """remote path -> content of what accepting a model writes. A host-side model's restore unit state goes with
    it: a service restarted onto the new model starts its restore unit first when that is not active (failed
    after a reboot), and the unit must then find the new model, not copy the source against the old sums."""
    files = {trust_path(spec.path): record.to_json()}
    if restorable:
        files[f"{state_dir(spec)}/manifest.json"] = record.manifest.to_json()
        files[f"{state_dir(spec)}/sha256sums"] = sums_text(record.manifest)
    return files


def read_trusted(remote: Connection, model_path: str) -> Trusted | None:
    """The record; on a host provisioned before records existed, what an earlier provision verified: the restore
    unit's manifest, else the manifest in /dev/shm (so a source corrupted before the upgrade is still caught)."""
    out = read(remote, Cmd.of("cat", "--", trust_path(model_path), sudo=True))
    trusted = parse_trusted(out.stdout) if out.exit_code == 0 else None
    if trusted is not None:
        return trusted
    state = f"{STATE_ROOT}/{model_name(model_path)}"
    for earlier in (f"{state}/manifest.json", f"{model_path.rstrip('/')}/{MANIFEST_NAME}"):
        out = read(remote, Cmd.of("cat", "--", earlier, sudo=True))
        manifest = parse_manifest_json(out.stdout) if out.exit_code == 0 else None
        if manifest is not None and manifest.files:
            return Trusted(manifest, "", f"earlier manifest {earlier}", recorded=False)
    return None


def local_path(host: Host, model_path: str) -> Path:
    """The control machine's copy of the host's record of this model."""
    where = f"{_UNSAFE.sub('_', host.name)}@{_UNSAFE.sub('_', host.address)}"
    return localfiles.state_dir() / "trust" / where / f"{model_name(model_path)}.json"


def read_local(host: Host, model_path: str) -> Trusted | None:
    try:
        text = local_path(host, model_path).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    record = parse_trusted(text)
    if record is None:
        return None
    when = f" at {record.accepted_at}" if record.accepted_at else ""
    return replace(record, accepted_at="", how=f"{record.how}{when}; the control machine's copy")


@dataclass(frozen=True)
class Reconciled:
    trusted: Trusted | None  # what a source is judged against
    conflict: bool = False  # the host's record and the control machine's copy name different models


def reconcile(on_host: Trusted | None, here: Trusted | None) -> Reconciled:
    """The pure decision between the host's record and the control machine's copy. A host record (not an
    earlier manifest) wins when both agree; the copy stands in when the host has lost its record (or has only
    an earlier manifest), and is then written back (recorded=False); two records that differ conflict."""
    if here is None:
        return Reconciled(on_host)
    if on_host is None or not on_host.recorded:
        return Reconciled(replace(here, recorded=False))
    return Reconciled(on_host, conflict=digest(on_host.manifest) != digest(here.manifest))


def conflict_hint(host: str, spec: ModelSpec) -> str:
    return (
        f"if the host's record is right (accepted from another control machine): "
        f"`opsctl provision -i INVENTORY --host {host} --accept-model {spec.path.rstrip('/')}`; "
        f"otherwise restore the model source from a good copy and accept it the same way"
    )


def keep_local(host: Host, spec: ModelSpec, written: Trusted | None, on_host: Trusted | None) -> list[KeepLocal]:
    """Bring the control machine's copy to the record the host holds after this run (the one written now, else
    its current one): nothing when the copy already names the same model."""
    record = written if written is not None else (on_host if on_host is not None and on_host.recorded else None)
    if record is None:
        return []
    here = read_local(host, spec.path)
    if here is not None and digest(here.manifest) == digest(record.manifest):
        return []
    return [KeepLocal(local_path(host, spec.path), record.to_json())]


class Trust(StrEnum):
    FIRST_USE = "first use"  # nothing recorded yet: this source becomes the accepted model
    MATCHES = "matches"  # the source is the accepted model
    ACCEPTED = "accepted"  # it differs, and the operator accepted it as the new model (--accept-model)
    REFUSED = "refused"  # it differs from the accepted model: corrupt or replaced; nothing is copied


@dataclass(frozen=True)
class SourceVerdict:
    trust: Trust
    detail: str = ""  # which files differ, for the one-line refusal
    record: bool = False  # whether this run (re)writes the trust record


def judge_source(trusted: Trusted | None, source: Manifest, accept: bool) -> SourceVerdict:
    """The pure decision: may this source's bytes become (or stay) the model on the host?"""
    if trusted is None:
        return SourceVerdict(Trust.FIRST_USE, record=True)
    state = compare(trusted.manifest, source.files)
    if state.matches:
        return SourceVerdict(Trust.MATCHES, record=not trusted.recorded)
    parts = [
        f"{label} {_few(sorted(names))}"
        for label, names in (("differ:", state.bad), ("missing:", state.missing), ("not accepted:", state.extra))
        if names
    ]
    return SourceVerdict(Trust.ACCEPTED if accept else Trust.REFUSED, "; ".join(parts), record=accept)


def accept_hint(host: str, spec: ModelSpec) -> str:
    return (
        f"restore the source from a good copy, or if it is a new model accept it: "
        f"`opsctl provision -i INVENTORY --host {host} --accept-model {spec.path.rstrip('/')}`"
    )


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
