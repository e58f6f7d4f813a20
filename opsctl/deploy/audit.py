"""The audit log: one line per action, on the host (/var/lib/opsctl/audit.log) and on the control machine.

Line format (key=value, values with spaces JSON-quoted): `time=... who=... host=... service=... action=...
release=... result=... detail="..."`. Never contains a secret: callers pass ids, modes and messages only.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
from datetime import UTC, datetime
from pathlib import Path

from opsctl.commands import Cmd, sh

HOST_LOG = "/var/lib/opsctl/audit.log"


def local_log_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "opsctl" / "audit.log"


def who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _value(text: str) -> str:
    return text if text and all(c.isalnum() or c in "-_.:/@,+" for c in text) else json.dumps(text)


def audit_line(
    host: str, service: str, action: str, release: str | None, result: str, detail: str = "",
    now: datetime | None = None,
) -> str:  # fmt: skip
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fields = {
        "time": when, "who": who(), "host": host, "service": service, "action": action,
        "release": release or "-", "result": result, "detail": " ".join(detail.split()),
    }  # fmt: skip
    return " ".join(f"{k}={_value(v)}" for k, v in fields.items())


def append_host_cmd(line: str) -> Cmd:
    parent = HOST_LOG.rsplit("/", 1)[0]
    return sh(f"mkdir -p {parent} && printf '%s\\n' {shlex.quote(line)} >> {HOST_LOG}", sudo=True)


def append_local(line: str, path: Path | None = None) -> None:
    target = path or local_log_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as fh:
            fh.write(line + "\n")
    except OSError:
        pass  # the local copy is a convenience; the host's log is the record
