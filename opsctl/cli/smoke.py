"""`opsctl smoke`: per service /v1/models + one chat completion; `--equivalence` compares greedy tokens (and
seeded sampled ones where both servers draw with seeds) against a baseline-mode service."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import httpx
import typer

from opsctl.cli.common import (
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
from opsctl.errors import ExitCode, OpsctlError, SmokeError
from opsctl.health import auth_headers, base_url
from opsctl.inventory.model import Host, Inventory, Mode, Router, Service
from opsctl.inventory.select import select, select_routers
from opsctl.progress import Ticker
from opsctl.router.render import router_url
from opsctl.smoke import (
    EquivalenceReport,
    Generation,
    PromptAgreement,
    comparable,
    load_prompts,
    run_equivalence,
    seeded_sampling,
    smoke_service,
)


def find_baseline(inv: Inventory, spec: str | None) -> tuple[Host, Service]:
    """`--baseline NAME` or `HOST/NAME`; default: the inventory's only baseline-mode service."""
    pairs = [(h, s) for h in inv.hosts for s in h.services]
    if spec is None:
        found = [(h, s) for h, s in pairs if s.mode is Mode.BASELINE]
        if len(found) != 1:
            listed = ", ".join(f"{h.name}/{s.name}" for h, s in found) or "none"
            raise SmokeError(
                f"--equivalence needs one baseline service; baseline-mode services in the inventory: {listed}",
                "pass --baseline SERVICE (or HOST/SERVICE)",
            )
        return found[0]
    host_name, _, svc_name = spec.rpartition("/")
    found = [(h, s) for h, s in pairs if s.name == svc_name and (not host_name or h.name == host_name)]
    if len(found) != 1:
        how = "matches no service" if not found else "is ambiguous: use HOST/SERVICE"
        raise SmokeError(f"--baseline {spec} {how}", "see the inventory's services")
    return found[0]


def register(app: typer.Typer) -> None:
    @app.command("smoke")
    @handle_errors
    def smoke(
        inventory: InventoryOpt,
        host: HostOpt = None,
        service: ServiceOpt = None,
        equivalence: Annotated[
            bool, typer.Option("--equivalence", help="Compare greedy tokens with a baseline service.")
        ] = False,
        baseline: Annotated[
            str | None, typer.Option("--baseline", help="Baseline service: NAME or HOST/NAME (mode baseline).")
        ] = None,
        prompts: Annotated[Path | None, typer.Option("--prompts", help="Prompt YAML (default: shipped set).")] = None,
        threshold: Annotated[
            float, typer.Option("--threshold", min=0.0, max=1.0, help="Required fraction of identical prompts.")
        ] = 1.0,
        timeout: Annotated[float, typer.Option("--timeout", help="Seconds per request.")] = 120.0,
        router: RouterOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Smoke-test services (HTTP 200, finish_reason stop|length, tokens > 0, text non-empty); `--router NAME`:
        the same request through that router (it picks the worker)."""
        inv = load_inventory(inventory)
        if router is not None:
            with httpx.Client() as client:
                ok = _smoke_routers(client, inv, select_routers(inv, split_selector(router)), timeout, as_json)
            raise typer.Exit(int(ExitCode.OK if ok else ExitCode.ERROR))
        selection = [(h, s) for h, svcs in select(inv, split_selector(host), split_selector(service)) for s in svcs]
        if not selection:
            raise SmokeError("no services selected", "the inventory's hosts have no services")
        with httpx.Client() as client:
            if equivalence:
                ok = _equivalence(client, inv, selection, baseline, prompts, threshold, as_json)
            else:
                ok = _smoke(client, selection, timeout, as_json)
        raise typer.Exit(int(ExitCode.OK if ok else ExitCode.ERROR))


def _smoke_routers(client: httpx.Client, inv: Inventory, routers: list[Router], timeout: float, as_json: bool) -> bool:
    results = []
    for r in routers:
        name = f"router {r.name}"
        result = smoke_service(client, r.host, name, router_url(inv, r), auth_headers(r.api_key), timeout=timeout)
        results.append(result)
        verdict = "[green]ok[/]" if result.ok else "[bold red]FAILED[/]"
        console.print(f"{r.host}/{name}: {verdict} {result.latency_s:.1f}s model={result.model}", markup=True)
        for reason in result.reasons:
            console.print(f"    {reason}", markup=False)
    if as_json:
        emit_json(results)
    return all(x.ok for x in results)


def _smoke(client: httpx.Client, selection: list[tuple[Host, Service]], timeout: float, as_json: bool) -> bool:
    results = []
    for h, s in selection:
        r = smoke_service(
            client, h.name, s.name, base_url(h, s), auth_headers(s.api_key), prompt=s.smoke_prompt, timeout=timeout
        )
        results.append(r)
        verdict = "[green]ok[/]" if r.ok else "[bold red]FAILED[/]"
        console.print(f"{h.name}/{s.name}: {verdict} {r.latency_s:.1f}s model={r.model}", markup=True)
        if r.ok:
            console.print(
                f"    {r.finish_reason}, {r.completion_tokens} tokens: {r.text.strip()[:200]!r}", markup=False
            )
        for reason in r.reasons:
            console.print(f"    {reason}", markup=False)
    if as_json:
        emit_json(results)
    return all(r.ok for r in results)


def _equivalence(
    client: httpx.Client,
    inv: Inventory,
    selection: list[tuple[Host, Service]],
    baseline: str | None,
    prompts_file: Path | None,
    threshold: float,
    as_json: bool,
) -> bool:
    b_host, b_svc = find_baseline(inv, baseline)
    prompts = load_prompts(prompts_file)
    b_seeded = seeded_sampling(b_svc.engine.value, b_svc.extra_args)
    cache: dict[str, Generation] = {}
    reports = []
    b_name = f"{b_host.name}/{b_svc.name}"
    for h, s in selection:
        if (h.name, s.name) == (b_host.name, b_svc.name):
            continue
        name = f"{h.name}/{s.name}"
        seeded = b_seeded and seeded_sampling(s.engine.value, s.extra_args)
        plan = comparable(prompts, s.engine.value, s.mode.value, seeded)
        kinds = sorted(
            {"greedy" if p.plain else "seeded sampled" if p.seeded else "greedy with rules" for p in plan.prompts}
        )
        shown = f"{len(plan.prompts)} prompts" + (f", {' and '.join(kinds)}" if kinds else "")
        console.print(f"{name} vs {b_name} ({s.engine.value} {s.mode.value}): {shown}", markup=False)
        for gone in plan.left_out:
            console.print(f"    {len(gone.ids)} left out ({', '.join(gone.ids)}): {gone.why}", markup=False)
        if not plan.prompts:
            why = f"no prompt of the file is one that {s.engine.value} {s.mode.value} promises to match"
            reports.append(EquivalenceReport(name, b_name, threshold, error=why, left_out=plan.left_out))
            console.print(f"[bold red]{name}: ERROR[/] {why}: add greedy prompts without penalties", markup=True)
            continue

        try:
            with Ticker(f"    {name} vs {b_name}", out=lambda line: console.print(line, markup=False)) as ticker:
                done: list[str] = []
                ticker.update(f"generating, {len(plan.prompts)} prompts to go")

                def show(
                    a: PromptAgreement, done: list[str] = done, ticker: Ticker = ticker, total: int = len(plan.prompts)
                ) -> None:
                    where = "identical" if a.equal else f"DIVERGES at {a.unit[:-1]} {a.first_divergence}"
                    line = f"    {a.id:<14} {where} ({a.length_service} vs {a.length_baseline} {a.unit})"
                    console.print(line, markup=False)
                    done.append(a.id)
                    ticker.update(f"generating, {total - len(done)} prompts to go")

                report = run_equivalence(
                    client,
                    (name, base_url(h, s), auth_headers(s.api_key)),
                    (b_name, base_url(b_host, b_svc), auth_headers(b_svc.api_key)),
                    plan.prompts,
                    threshold,
                    cache,
                    progress=show,
                    seeded=seeded,
                )
        except OpsctlError as exc:  # one service down must not hide the others' results
            reports.append(EquivalenceReport(name, b_name, threshold, error=exc.one_line(), left_out=plan.left_out))
            console.print(f"[bold red]{name}: ERROR[/] {exc.one_line()}", markup=True)
            continue
        report = replace(report, left_out=plan.left_out)
        reports.append(report)
        verdict = "[green]PASS[/]" if report.passed else "[bold red]FAIL[/]"
        console.print(
            f"{name}: {verdict} agreement {report.agreement:.0%} of prompts (threshold {threshold:.0%}), "
            f"{report.token_agreement:.1%} of positions",
            markup=True,
        )
    if not reports:
        raise SmokeError("no service to compare: only the baseline was selected", "select other services")
    if as_json:
        emit_json(reports)
    return all(r.passed for r in reports)
