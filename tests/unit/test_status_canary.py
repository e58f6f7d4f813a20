"""`status` shows a router's last canary in one line; `--canary` prints its whole comparison table (every plain
`status` used to repeat the table of a canary long finished)."""

from __future__ import annotations

import dataclasses

from opsctl.cli.common import console
from opsctl.cli.status import _router_table
from opsctl.router.status import RouterStatus

TABLE = [
    "group   requests  errors  p50_ms",
    "canary        40       0     210",
    "old           80       0     205",
    "verdict: PROMOTE (no difference beyond the thresholds)",
]
CANARY = {
    "phase": "promoted", "updated": "2026-12-05T20:00:00Z", "canary": ["lab1/ref"], "old": ["lab2/ref"],
    "message": "promoted: the rest of the fleet deployed", "table": TABLE,
}  # fmt: skip


def _printed(canary_table: bool) -> list[str]:
    row = RouterStatus("front", "h1", "http://10.0.0.1:30080", None, "R1", 1, 0, None, "HTTP 200 in 2 ms", True)
    row = dataclasses.replace(row, canary=CANARY)
    with console.capture() as out:
        _router_table([row], canary_table=canary_table)
    return [line for line in out.get().splitlines() if "canary" in line or line.startswith("      ")]


def test_status_prints_the_last_canary_in_one_line() -> None:
    (line,) = _printed(canary_table=False)
    assert line.strip() == (
        "canary promoted (updated 2026-12-05T20:00:00Z): canary lab1/ref vs old lab2/ref; promoted: the rest of the "
        "fleet deployed (comparison: 4 lines, `opsctl status --canary`)"
    )


def test_status_canary_prints_the_table() -> None:
    lines = _printed(canary_table=True)
    assert "`opsctl status --canary`" not in lines[0]
    assert [line.strip() for line in lines[1:]] == TABLE
