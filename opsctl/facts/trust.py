"""The model accepted on each host, as SSH's known_hosts holds host keys: its record on the host
(`/var/lib/opsctl/models/<name>/trusted.json`) and the control machine's copy of it (`$XDG_STATE_HOME/opsctl/
trust/<host>@<address>/<name>.json`), read and parsed. Provision writes them (opsctl.ops.model_trust, where the
rules of trust on first use live); provision, deploy, rollback and status judge models against them
(opsctl.facts.modelcheck).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, replace
from pathlib import Path

from opsctl import localfiles
from opsctl.commands import Cmd
from opsctl.facts.manifest import MANIFEST_NAME, FileEntry, Manifest, parse_manifest_json
from opsctl.inventory.model import Host, ModelSpec
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


def read_trusted(remote: Connection, model_path: str) -> Trusted | None:
    """The record; on a host provisioned before records existed, what an earlier provision verified: the restore
    unit's manifest, else the manifest in /dev/shm (so a source corrupted before the upgrade is still caught)."""
    out = remote.run(Cmd.of("cat", "--", trust_path(model_path), sudo=True), timeout=120.0, check=False)
    trusted = parse_trusted(out.stdout) if out.exit_code == 0 else None
    if trusted is not None:
        return trusted
    state = f"{STATE_ROOT}/{model_name(model_path)}"
    for earlier in (f"{state}/manifest.json", f"{model_path.rstrip('/')}/{MANIFEST_NAME}"):
        out = remote.run(Cmd.of("cat", "--", earlier, sudo=True), timeout=120.0, check=False)
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
