"""model_trust: each model's accepted (known-good) manifest on its host, as SSH's known_hosts holds host keys.

Trust on first use: the first provision that copies a model (or finds it verified in place) records the
source's manifest (size and sha256 per file) as accepted, in `/var/lib/opsctl/models/<name>/trusted.json` on
the host (it survives the reboots that empty /dev/shm). After that, only an explicit act changes it:
`opsctl provision --accept-model PATH`. Every source is judged against it before anything is copied, so a
corrupted source (host-side or on the control machine) is refused with what differs: it is never copied,
never written into the model's manifest or the restore unit's sha256sums. Deploy, rollback and status judge
the copy in /dev/shm against the same record (opsctl.facts.modelcheck).

The control machine keeps a copy of each host's record, `$XDG_STATE_HOME/opsctl/trust/<host>@<address>/
<name>.json` (default ~/.local/state), written whenever the host's is: a host whose record was lost (its disk
replaced, /var/lib wiped) still has its model remembered, a corrupt source is still refused, and the record is
written back. A host record that differs from the control machine's copy is refused (`reconcile`) until the
operator says which is right with the one explicit act, `--accept-model`.

The record's format and its reads (on the host and on the control machine) are opsctl.facts.trust's: deploy and
status read them too. This module holds the rules and what accepting writes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from opsctl.facts.manifest import Manifest, compare
from opsctl.facts.trust import Trusted, digest, local_path, read_local, state_dir, trust_path
from opsctl.inventory.model import Host, ModelSpec
from opsctl.ops.base import KeepLocal


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
