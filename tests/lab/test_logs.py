"""`opsctl logs --since` against a lab host's real journald: the window's latest lines, and how many it left out.

No deploy: a transient unit named as a service's (`systemd-run --unit opsctl-<name>.service`) writes the lines,
and a derived inventory names that service, so the real CLI reads them over SSH as it reads a service's.
"""

from __future__ import annotations

import json
import secrets
import shlex
from pathlib import Path

from opsctl.commands import sh
from tests.lab.deploy_support import add_service, derived_inventory, only_hosts, opsctl, remote_run

LINES = 500
METRICS = 300


def _metrics_line(i: int) -> str:
    return (
        f"DDTREE metrics rounds={i} tokens={2 * i} tau={1 + i / 1000:.3f} nodes=7.000 depth=6.500 off_spine=0.000 "
        "draft_ms=1.0 build_ms=1.0 verify_ms=1.0 commit_ms=1.0 tok_s=1.0"
    )


def test_logs_since_shows_the_latest_lines_of_the_window_and_says_what_it_cut(
    lab_inventory: object, tmp_path: Path
) -> None:
    name = f"lp{secrets.token_hex(3)}"  # a fresh unit: no earlier run's lines in the window

    def mutate(doc: dict[str, object]) -> None:
        only_hosts(doc, ["lab1"])  # type: ignore[arg-type]
        add_service(doc, "lab1", name, 30090)  # type: ignore[arg-type]

    inv = derived_inventory(tmp_path / "inv.yaml", mutate)
    # the host's own clock: the window starts before the unit's first line
    since = remote_run(inv, "lab1", sh("date -d '-5 sec' '+%Y-%m-%d %H:%M:%S'")).strip()
    script = f"for i in $(seq 1 {LINES}); do echo plain $i; done; " + "; ".join(
        f"echo '{_metrics_line(i)}'" for i in range(1, METRICS + 1)
    )
    unit = f"opsctl-{name}.service"
    remote_run(inv, "lab1", sh(f"systemd-run --quiet --unit {unit} --wait sh -c {shlex.quote(script)}"))
    # the window as journald holds it (systemd's own "Started ..." lines are the unit's too)
    count = f"journalctl -u {unit} --since {shlex.quote(since)} --no-pager -o cat | wc -l"
    total = int(remote_run(inv, "lab1", sh(count)))
    assert total >= LINES + METRICS

    shown = opsctl("logs", "-i", str(inv), name, "--since", since, "-n", "20")
    assert shown.returncode == 0, shown.stderr[-2000:]
    out = shown.stdout.splitlines()
    assert len(out) == 20 and out[-1].endswith(_metrics_line(METRICS)), out[-3:]
    assert out[0].endswith(_metrics_line(METRICS - 19))
    assert f"lab1/{name}: showing the latest 20 lines since {since!r}; {total - 20} older left out" in shown.stderr

    everything = opsctl("logs", "-i", str(inv), name, "--since", since, "-n", str(total + 5))
    assert len(everything.stdout.splitlines()) >= total and "left out" not in everything.stderr

    grepped = opsctl("logs", "-i", str(inv), name, "--since", since, "-n", "3", "--grep", "^.*plain [0-9]+$")
    assert [ln.rsplit(" ", 1)[1] for ln in grepped.stdout.splitlines()] == [str(LINES - 2), str(LINES - 1), str(LINES)]
    assert f"{LINES - 3} older left out" in grepped.stderr

    # --metrics --since: the latest tau, and the same word about the cut
    tau = opsctl("logs", "-i", str(inv), name, "--since", since, "--metrics", "--json")
    assert tau.returncode == 0, tau.stderr[-2000:]
    summary = json.loads(tau.stdout)["summary"][f"lab1/{name}"]
    assert summary["last_metrics"]["tau"] == 1 + METRICS / 1000 and summary["last_metrics"]["rounds"] == METRICS
    matching = int(remote_run(inv, "lab1", sh(f"{count.replace(' | wc -l', '')} | grep -cE 'DDTREE |Decode batch'")))
    assert f"{matching - 200} older left out" in tau.stderr and matching >= METRICS
    assert json.loads(tau.stdout)["left_out"] == {f"lab1/{name}": matching - 200}

    bad = opsctl("logs", "-i", str(inv), name, "--since", "not a time")
    assert bad.returncode == 1 and "lab1" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]
