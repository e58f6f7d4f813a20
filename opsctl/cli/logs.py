"""`opsctl logs`: journalctl of the selected units on all selected hosts in parallel, lines prefixed with
host/service; `-f` follows (cursor polling, nothing left running remotely); `--metrics` parses DDTREE and
SGLang `Decode batch` lines into a table or --json."""

from __future__ import annotations

import re
import time
from typing import Annotated

import typer
from rich.markup import escape

from opsctl import metrics
from opsctl.cli.common import (
    ForksOpt,
    HostOpt,
    InventoryOpt,
    JsonOpt,
    RouterOpt,
    ServiceOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)
from opsctl.errors import ExitCode, SelectorError, host_line
from opsctl.inventory.select import select, select_routers
from opsctl.logs import METRICS_PATTERN, Pair, Unit, follow_logs, read_logs, valid_grep
from opsctl.systemd import JournalQuery


def register(app: typer.Typer) -> None:
    @app.command("logs")
    @handle_errors
    def logs(
        inventory: InventoryOpt,
        service_arg: Annotated[str | None, typer.Argument(metavar="[SERVICE]", help="Only this service.")] = None,
        host: HostOpt = None,
        service: ServiceOpt = None,
        follow_: Annotated[
            bool, typer.Option("-f", "--follow", help="Keep printing new lines (Ctrl-C stops).")
        ] = False,
        since: Annotated[str | None, typer.Option("--since", help="journalctl --since, e.g. '10 min ago'.")] = None,
        lines: Annotated[int, typer.Option("-n", "--lines", min=1, help="Lines per unit.")] = 200,
        grep: Annotated[str | None, typer.Option("--grep", help="Only lines matching this regex.")] = None,
        show_metrics: Annotated[
            bool, typer.Option("--metrics", help="Parse DDTREE / Decode batch lines into a table.")
        ] = False,
        router: RouterOpt = None,
        forks: ForksOpt = 16,
        as_json: JsonOpt = False,
    ) -> None:
        """Show the services' journal, each line prefixed with host/service."""
        from opsctl.remote import connect

        if grep is not None and not valid_grep(grep):
            raise SelectorError(f"--grep {grep!r} is not a valid regular expression", "fix the pattern")
        inv = load_inventory(inventory)
        services = [*(split_selector(service) or []), *([service_arg] if service_arg else [])] or None
        pairs: list[Pair] = []
        if router is None or services is not None or host is not None:
            pairs = [(h, s) for h, svcs in select(inv, split_selector(host), services) for s in svcs]
        if router is not None:
            routers = select_routers(inv, split_selector(router))
            pairs += [(inv.host(r.host), Unit(r.unit_base, r.unit_name)) for r in routers]
        if not pairs:
            raise SelectorError("no services selected", "the inventory's hosts have no services")
        if show_metrics:
            grep = METRICS_PATTERN if grep is None else grep
            lines = max(lines, 20000) if since is None else lines
        query = JournalQuery("", since, lines, grep)
        if follow_ and not show_metrics:
            try:
                for label, line in follow_logs(pairs, query, connect, time.sleep):
                    typer.echo(f"{label} | {_ANSI.sub('', line)}")
            except KeyboardInterrupt:
                raise typer.Exit(int(ExitCode.OK)) from None  # a clean stop, not an error
            return
        outcomes = read_logs(pairs, query, connect, forks)
        failed = False
        collected: dict[str, list[str]] = {}
        left_out: dict[str, int] = {}  # source -> older lines of the --since window that the line limit cut
        for outcome in outcomes:
            if outcome.error is not None:
                console.print(f"[bold red]{escape(host_line(outcome.host, outcome.error.one_line()))}[/]", markup=True)
                failed = True
                continue
            page = outcome.value
            if page is None:
                continue
            collected[outcome.host] = [_ANSI.sub("", line) for line in page.lines]
            if page.left_out:
                left_out[outcome.host] = page.left_out
                console.print(_left_out_line(outcome.host, page.left_out, len(page.lines), since), markup=False)
        if show_metrics:
            _metrics(collected, as_json, left_out)
        elif as_json:
            emit_json([{"source": k, "line": line} for k, v in collected.items() for line in v])
        else:
            for label, found in collected.items():
                for line in found:
                    typer.echo(f"{label} | {line}")
        if failed:
            raise typer.Exit(int(ExitCode.ERROR))


def _left_out_line(label: str, left_out: int, shown: int, since: str | None) -> str:
    """What a --since window cut: the output is its latest lines, and says so."""
    what = "lines" if shown != 1 else "line"
    return (
        f"{label}: showing the latest {shown} {what} since {since!r}; {left_out} older left out"
        " (raise -n or narrow --since to see them)"
    )


# sglang-router colours its log lines (tracing's ANSI codes, whatever NO_COLOR says): shown plain.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _metrics(collected: dict[str, list[str]], as_json: bool, left_out: dict[str, int] | None = None) -> None:
    rows = []
    summaries = {}
    for label, found in collected.items():
        records = metrics.parse_lines(found)
        summaries[label] = metrics.summarize(records)
        for line, record in zip(found, (metrics.parse_line(x) for x in found), strict=True):
            if isinstance(record, metrics.DDTreeMetrics | metrics.DecodeBatch):
                rows.append((label, line.split(" ", 1)[0], record))
    if as_json:
        emit_json(
            {
                "summary": summaries,
                "left_out": left_out or {},  # what the summary does not cover (stderr says it too)
                "lines": [{"source": label, "time": when, "record": r} for label, when, r in rows],
            }
        )
        return
    header = f"{'source':<12} {'time':<25} {'kind':<7} {'rounds':>6} {'tau':>5} {'nodes':>6} {'depth':>5} "
    typer.echo(header + f"{'off_spine':>9} {'accept':>6} {'tok/s':>7}")
    for label, when, r in rows:
        if isinstance(r, metrics.DDTreeMetrics):
            kind = "UNSAFE" if r.hybrid_unsafe else "ddtree"
            typer.echo(
                f"{label:<12} {when:<25} {kind:<7} {r.rounds:>6} {r.tau:>5.2f} {r.nodes:>6.1f} {r.depth:>5.1f} "
                f"{r.off_spine:>9.2f} {'':>6} {r.tok_s:>7.1f}"
            )
        else:
            accept = f"{r.accept_len:.2f}" if r.accept_len is not None else ""
            typer.echo(f"{label:<12} {when:<25} {'decode':<7} {'':>6} {'':>5} {'':>6} {'':>5} {'':>9} {accept:>6} "
                       f"{r.gen_throughput:>7.1f}")  # fmt: skip
    for label, s in summaries.items():
        if s.init:
            console.print(
                f"{label}: mode={s.init.mode} budget={s.init.budget} topk={s.init.topk} block={s.init.block} "
                f"hybrid={s.init.hybrid}" + (f"; last tau={s.last_metrics.tau:.2f}" if s.last_metrics else ""),
                markup=False,
            )
        policy = s.last_metrics.policy if s.last_metrics else None
        if policy is not None:
            console.print(f"{label}: policy {policy.describe()}; {_estimates(policy)}", markup=False)
        if s.malformed:
            console.print(f"{label}: {s.malformed} malformed metrics lines ignored", markup=False)
        if s.hybrid_unsafe:
            console.print(f"[bold yellow]WARNING: {label} runs hybrid=unsafe tree verify (inexact)[/]", markup=True)
    if not rows:
        console.print("no DDTREE metrics or Decode batch lines found (has the service served any requests?)")


def _estimates(policy: metrics.PolicyState) -> str:
    """`tok/ms tree32=4.52 chain=6.94 (switches 2, probes 115)` for the policy's latest bucket."""
    rates = " ".join(f"{shape}={'-' if r is None else f'{r:.2f}'}" for shape, r in policy.estimates.items())
    return f"tok/ms {rates or '-'} (switches {policy.switches}, probes {policy.probes})"
