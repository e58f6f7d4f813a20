"""journalctl over SSH: commands, output parsing, and the cursor-based follow loop.

Following polls `journalctl --after-cursor` once a second instead of holding a remote `journalctl -f` open:
every poll is a short command that has exited before the next starts, so Ctrl-C can never leave a remote
journalctl behind (and a poll in flight is killed with its process group by the remote layer).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from opsctl.commands import Cmd, sh

CURSOR_PREFIX = "-- cursor: "
METRICS_PATTERN = "DDTREE |Decode batch"


@dataclass(frozen=True)
class JournalQuery:
    unit: str
    since: str | None = None  # journalctl --since syntax ("10 min ago", "2026-11-29 22:00")
    lines: int | None = 200  # -n; None = all
    grep: str | None = None  # extended regex, applied on the host (grep -E)
    cursor: str | None = None  # continue after this cursor (follow)


def journal_cmd(q: JournalQuery) -> Cmd:
    argv = ["journalctl", "-u", q.unit, "--no-pager", "-o", "short-iso", "--show-cursor"]
    if q.cursor:
        argv += ["--after-cursor", q.cursor]
    else:
        if q.since:
            argv += ["--since", q.since]
        if q.lines is not None:
            argv += ["-n", str(q.lines)]
    if not q.grep:
        return Cmd.of(*argv, sudo=True)
    # Filter on the host (less to transfer) but keep the cursor line; grep exits 1 on no match: not an error.
    pattern = shlex.quote(f"({q.grep})|^{CURSOR_PREFIX}")
    return sh(f"{shlex.join(argv)} | grep -E -- {pattern} || true", sudo=True)


def parse_journal(stdout: str) -> tuple[list[str], str | None]:
    """Lines (without journalctl's '-- No entries --' notices) and the trailing cursor."""
    lines: list[str] = []
    cursor: str | None = None
    for line in stdout.splitlines():
        if line.startswith(CURSOR_PREFIX):
            cursor = line[len(CURSOR_PREFIX) :].strip()
        elif line.startswith("-- ") and line.endswith(" --"):
            continue  # "-- No entries --", "-- Boot ... --"
        elif line:
            lines.append(line)
    return lines, cursor


@dataclass(frozen=True)
class Source:
    label: str  # "host/service", the prefix of each printed line
    fetch: Callable[[JournalQuery], str]  # runs journal_cmd on the right host, returns stdout
    query: JournalQuery


def follow(
    sources: Sequence[Source],
    sleep: Callable[[float], None],
    interval: float = 1.0,
    rounds: int | None = None,
) -> Iterator[tuple[str, str]]:
    """(label, line) as they arrive, polling each source by cursor; stops on Ctrl-C or after `rounds`."""
    cursors: dict[str, str | None] = {s.label: None for s in sources}
    n = 0
    while rounds is None or n < rounds:
        for s in sources:
            cursor = cursors[s.label]
            query = JournalQuery(s.query.unit, s.query.since, s.query.lines, s.query.grep, cursor)
            lines, new_cursor = parse_journal(s.fetch(query))
            if new_cursor:
                cursors[s.label] = new_cursor
            for line in lines:
                yield s.label, line
        n += 1
        if rounds is None or n < rounds:
            sleep(interval)


_GREP_SAFE = re.compile(r"^[^\n\r]*$")


def valid_grep(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return bool(_GREP_SAFE.match(pattern))


# An HTTP access line for a health probe (uvicorn's and SGLang's shape): `... "GET /health HTTP/1.1" 200 OK`.
_HEALTH_PROBE = re.compile(r'"(?:GET|HEAD) /(?:health|health_generate|ready)(?:\?\S*)? HTTP/[\d.]+" \d{3}')


def without_health_probes(lines: Sequence[str]) -> list[str]:
    """Journal lines minus the health probes' access lines: during a gate they are most of the tail and bury
    the lines that say why a server failed."""
    return [line for line in lines if not _HEALTH_PROBE.search(line)]
