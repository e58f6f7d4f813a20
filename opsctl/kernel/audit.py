"""The audit log: one line per action, on the host (/var/lib/opsctl/audit.log) and on the control machine.

Line format (key=value, values with spaces JSON-quoted): `time=... who=... host=... service=... action=...
release=... result=... detail="..." inventory=...`. Never contains a secret: callers pass ids, modes and
messages only. On the control machine each inventory file has its own log (`local_log_path`), so the lines of
a lab inventory and a production one are never mixed; `inventory=` names the file in both logs.

Every audit line is written by `record`: the control machine's line, then (when connected) the host's copy.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import shlex
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.commands import Cmd, sh
from opsctl.errors import OpsctlError
from opsctl.localfiles import state_dir

if TYPE_CHECKING:
    from opsctl.inventory.model import Host
    from opsctl.remote.base import Connection

HOST_LOG = "/var/lib/opsctl/audit.log"


def local_log_path(inventory: str = "") -> Path:
    """`$XDG_STATE_HOME/opsctl/audit/<file stem>-<hash of its absolute path>.log`: one log per inventory file
    (two files both named lab.yaml stay apart); `audit.log` beside it for lines without an inventory."""
    state = state_dir()
    if not inventory:
        return state / "audit.log"
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(inventory).stem)[:60] or "inventory"
    return state / "audit" / f"{stem}-{hashlib.sha256(inventory.encode()).hexdigest()[:12]}.log"


def who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _value(text: str) -> str:
    return text if text and all(c.isalnum() or c in "-_.:/@,+" for c in text) else json.dumps(text)


def audit_line(
    host: str, service: str, action: str, release: str | None, result: str, detail: str = "",
    now: datetime | None = None, inventory: str = "",
) -> str:  # fmt: skip
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fields = {
        "time": when, "who": who(), "host": host, "service": service, "action": action,
        "release": release or "-", "result": result, "detail": " ".join(detail.split()),
    }  # fmt: skip
    if inventory:
        fields["inventory"] = inventory
    return " ".join(f"{k}={_value(v)}" for k, v in fields.items())


def append_host_cmd(line: str) -> Cmd:
    parent = HOST_LOG.rsplit("/", 1)[0]
    return sh(f"mkdir -p {parent} && printf '%s\\n' {shlex.quote(line)} >> {HOST_LOG}", sudo=True)


def append_local(line: str, inventory: str = "", path: Path | None = None) -> None:
    target = path or local_log_path(inventory)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as fh:
            fh.write(line + "\n")
    except OSError:
        pass  # the local copy is a convenience; the host's log is the record


def record(
    host: Host, service: str, action: str, release: str | None, result: str, detail: str = "",
    conn: Connection | None = None,
) -> str:  # fmt: skip
    """Audit one action: the line goes to the control machine's log of the host's inventory, and through `conn`
    (when given) to the host's own log. The host's copy is best effort: a host that is gone keeps the local
    line. Returns the line."""
    line = audit_line(host.name, service, action, release, result, detail, inventory=host.inventory)
    append_local(line, host.inventory)
    if conn is not None:
        try:
            conn.run(append_host_cmd(line), check=False, timeout=30)
        except OpsctlError:
            pass  # host gone: the local line still records it
    return line
