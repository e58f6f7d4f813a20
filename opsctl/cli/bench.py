"""`opsctl bench`: the selected services side by side (tok/s, TTFT, tau), as a table, JSON and a PNG chart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from opsctl.bench.chart import write_chart
from opsctl.bench.load import bench_levels, level_json, parse_levels
from opsctl.bench.measure import Sample
from opsctl.bench.prompts import BenchPrompt, load_prompts
from opsctl.bench.report import TABLE_HEADER, Report, summarize, table_rows
from opsctl.bench.run import BenchSettings, bench_router, bench_service
from opsctl.bench.sweep import parse_sweep, run_sweep
from opsctl.cli.common import (
    HostOpt,
    InventoryOpt,
    JsonOpt,
    RouterOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)
from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host, Service
from opsctl.inventory.select import select, select_routers


def register(app: typer.Typer) -> None:
    @app.command("bench")
    @handle_errors
    def bench(
        inventory: InventoryOpt,
        host: HostOpt = None,
        services: Annotated[
            list[str] | None, typer.Option("--services", "--service", help="Services to compare, in order (A,B,...).")
        ] = None,
        sweep: Annotated[
            str | None,
            typer.Option("--sweep", help="Redeploy ONE service across settings: budget=15,32,64 or topk=4,8."),
        ] = None,
        prompts: Annotated[Path | None, typer.Option("--prompts", help="YAML prompt set (default: shipped).")] = None,
        repeat: Annotated[int, typer.Option("--repeat", min=1, max=100, help="Repetitions per prompt.")] = 3,
        max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, max=8192)] = 128,
        chart: Annotated[Path | None, typer.Option("--chart", help="Write a PNG chart of tok/s and tau.")] = None,
        concurrency: Annotated[
            str | None,
            typer.Option("--concurrency", help="Requests in flight per level, e.g. 1,4,8,16,32 (tok/s per level)."),
        ] = None,
        temperature: Annotated[
            float, typer.Option("--temperature", min=0.0, max=2.0, help="With --concurrency; default greedy.")
        ] = 0.0,
        router: RouterOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Benchmark services: warm-up, N repeats of a prompt set at temperature 0, medians and min-max.
        `--router NAME`: also (or, alone, only) through that router. `--concurrency 1,4,8`: per service and
        level, tok/s per request and in all, TTFT, inter-token latency and tau."""
        inv = load_inventory(inventory)
        wanted = split_selector(services)
        routers = select_routers(inv, split_selector(router)) if router is not None else []
        picked = []
        if not routers or wanted or host:
            picked = [(h, s) for h, svcs in select(inv, split_selector(host), wanted) for s in svcs]
        if wanted:  # keep the user's order: the first arm is the reference of every ratio
            picked.sort(key=lambda hs: wanted.index(hs[1].name))
        if not picked and not routers:
            raise OpsctlError("no service selected", "name services with --services")
        settings = BenchSettings(repeat=repeat, max_tokens=max_tokens)
        prompt_set = load_prompts(prompts)
        progress = console.print if not as_json else (lambda _: None)
        if concurrency is not None or temperature:
            if concurrency is None or sweep or routers or chart is not None:
                raise OpsctlError(
                    "--temperature needs --concurrency, which works on services alone (no --sweep, --router, --chart)",
                    "run the sweep or router benchmark separately",
                )
            levels = parse_levels(concurrency)
            curves = [_curve(h, s, prompt_set, levels, repeat, max_tokens, temperature, progress) for h, s in picked]
            settings_json = {"repeat": repeat, "max_tokens": max_tokens, "temperature": temperature}
            if as_json:
                emit_json({"settings": settings_json | {"concurrency": list(levels)}, "services": curves})
            else:
                _print_levels(curves)
            return
        if sweep:
            if len(picked) != 1 or routers:
                raise OpsctlError("--sweep works on exactly one service", "select it with --services NAME")
            knob, values = parse_sweep(sweep)
            arms = run_sweep(picked[0][0], picked[0][1], knob, values, prompt_set, settings, progress)
        else:
            arms = [bench_service(h, s, prompt_set, settings, progress=progress) for h, s in picked]
            arms += [bench_router(inv, r, prompt_set, settings, progress) for r in routers]
        report = summarize(arms)
        if chart is not None:
            write_chart(report, chart)
        if as_json:
            emit_json(report_json(report, settings))
        else:
            _print_table(report)
        for warning in report.warnings:
            console.print(f"[bold yellow]WARNING:[/] {warning}")


def _curve(
    host: Host,
    service: Service,
    prompts: Sequence[BenchPrompt],
    levels: Sequence[int],
    repeat: int,
    max_tokens: int,
    temperature: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    results = bench_levels(host, service, prompts, levels, repeat, max_tokens, temperature, progress=progress)
    return {
        "host": host.name,
        "service": service.name,
        "mode": service.mode.value,
        "gpus": len(service.gpus),
        "budget": service.ddtree.budget if service.mode.ddtree else None,
        "levels": [level_json(r, len(service.gpus)) for r in results],
    }


def _print_levels(curves: list[dict[str, Any]]) -> None:
    header = ("service", "mode", "conc.", "tok/s/req", "tok/s/GPU", "TTFT ms", "ITL ms", "tau")
    table = Table(*header, title="opsctl bench --concurrency (medians over requests; tok/s/GPU: all tokens / wall)")
    for curve in curves:
        for lv in curve["levels"]:
            tau = f"{lv['tau']:.2f}" if lv["tau"] is not None else "-"
            table.add_row(
                f"{curve['host']}/{curve['service']}",
                curve["mode"],
                str(lv["concurrency"]),
                f"{lv['tok_s_per_request']:.1f}",
                f"{lv['tok_s_per_gpu']:.1f}",
                f"{lv['ttft_s'] * 1000:.1f}",
                f"{lv['itl_s'] * 1000:.2f}",
                tau,
            )
    Console(stderr=True, highlight=False, width=max(console.width, 140)).print(table)


def _print_table(report: Report) -> None:
    table = Table(*TABLE_HEADER, title="opsctl bench (tok/s = completion tokens / wall time, per request)")
    for row in table_rows(report):
        table.add_row(*row)
    # Nine columns: a pipe or a log gets 80 columns by default, which would truncate labels and wrap headers.
    Console(stderr=True, highlight=False, width=max(console.width, 140)).print(table)


def _sample_json(sample: Sample) -> dict[str, Any]:
    return {
        "prompt_id": sample.prompt_id,
        "repeat": sample.repeat,
        "completion_tokens": sample.completion_tokens,
        "wall_s": sample.wall_s,
        "ttft_s": sample.ttft_s,
        "tok_s": sample.tok_s,
        "finish_reason": sample.finish_reason,
    }


def report_json(report: Report, settings: BenchSettings) -> dict[str, Any]:
    arms = []
    for arm, summary in zip(report.arms, report.summaries, strict=True):
        arms.append(
            {
                "label": arm.label,
                "host": arm.host,
                "service": arm.service,
                "mode": arm.mode,
                "engine": arm.engine,
                "budget": arm.budget,
                "topk": arm.topk,
                "server_settings": dict(arm.settings),
                "accept_length": arm.accept_length,
                "samples": [_sample_json(s) for s in arm.samples],
                "summary": {
                    "requests": summary.requests,
                    "completion_tokens": summary.completion_tokens,
                    "tok_s": vars(summary.tok_s),
                    "ttft_s": vars(summary.ttft_s),
                    "ratio_to_first": summary.ratio,
                },
            }
        )
    return {
        "settings": {
            "repeat": settings.repeat,
            "max_tokens": settings.max_tokens,
            "temperature": 0,
            "warmup": settings.warmup,
            "thinking": False,
        },
        "arms": arms,
        "warnings": list(report.warnings),
    }
