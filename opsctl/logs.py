"""journalctl over a connection: the cursor-based follow loop (the commands and their parsing are in
opsctl.systemd).

Following polls `journalctl --after-cursor` once a second instead of holding a remote `journalctl -f` open:
every poll is a short command that has exited before the next starts, so Ctrl-C can never leave a remote
journalctl behind (and a poll in flight is killed with its process group by the remote layer).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host, Service
from opsctl.remote.base import Connect, Connection
from opsctl.remote.pool import HostOutcome, run_parallel
from opsctl.systemd import JournalPage, JournalQuery, journal_cmd, parse_journal, parse_journal_page

METRICS_PATTERN = "DDTREE |Decode batch"


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


@dataclass(frozen=True)
class Unit:
    """A journal to read that is not a service's: a router's (`router-<name>`, opsctl-router-<name>.service)."""

    name: str  # the label after "host/"
    unit_name: str


Pair = tuple[Host, Service | Unit]


def _connections(pairs: Sequence[Pair], connect: Connect, stack: ExitStack) -> dict[str, Connection]:
    conns: dict[str, Connection] = {}
    for h, _ in pairs:
        if h.name not in conns:
            conns[h.name] = connect(h)
            stack.callback(conns[h.name].close)
    return conns


def read_logs(
    pairs: Sequence[Pair], query: JournalQuery, connect: Connect, forks: int = 16
) -> list[HostOutcome[JournalPage]]:
    """Each (host, service)'s journal lines (`query` with its unit set per service) and how many older lines of
    the --since window the line limit left out, hosts in parallel; one outcome per pair, labelled host/service."""
    with ExitStack() as stack:
        conns = _connections(pairs, connect, stack)

        def one(pair: Pair) -> JournalPage:
            h, s = pair
            q = JournalQuery(s.unit_name, query.since, query.lines, query.grep)
            result = conns[h.name].run(journal_cmd(q), timeout=120, check=False)
            if result.exit_code != 0:
                raise journal_failed(result.exit_code, result.stderr, query.since)
            return parse_journal_page(result.stdout)

        return run_parallel(pairs, key=lambda p: f"{p[0].name}/{p[1].name}", fn=one, forks=forks)


def journal_failed(exit_code: int, stderr: str, since: str | None) -> OpsctlError:
    """journalctl's own complaint as one line (not the pipeline that ran it)."""
    said = stderr.strip().splitlines()
    last = said[-1][:200] if said else "no output"
    if since is not None and "timestamp" in last.lower():
        hint = "--since takes journalctl's time syntax: '15 min ago', 'today', '2026-12-05 20:00'"
        return OpsctlError(f"journalctl cannot read --since {since!r}: {last}", hint)
    return OpsctlError(f"journalctl exited {exit_code}: {last}", "run `journalctl -u UNIT` on the host")


def follow_logs(
    pairs: Sequence[Pair], query: JournalQuery, connect: Connect, sleep: Callable[[float], None]
) -> Iterator[tuple[str, str]]:
    """`follow` over every (host, service): (label, line) as they arrive, until Ctrl-C."""
    with ExitStack() as stack:
        conns = _connections(pairs, connect, stack)

        def fetch_for(h: Host) -> Callable[[JournalQuery], str]:
            return lambda q: conns[h.name].run(journal_cmd(q), timeout=120).stdout

        sources = [
            Source(f"{h.name}/{s.name}", fetch_for(h), JournalQuery(s.unit_name, query.since, query.lines, query.grep))
            for h, s in pairs
        ]
        yield from follow(sources, sleep)


# An HTTP access line for a health probe (uvicorn's and SGLang's shape): `... "GET /health HTTP/1.1" 200 OK`.
_HEALTH_PROBE = re.compile(r'"(?:GET|HEAD) /(?:health|health_generate|ready)(?:\?\S*)? HTTP/[\d.]+" \d{3}')


def without_health_probes(lines: Sequence[str]) -> list[str]:
    """Journal lines minus the health probes' access lines: during a gate they are most of the tail and bury
    the lines that say why a server failed."""
    return [line for line in lines if not _HEALTH_PROBE.search(line)]
