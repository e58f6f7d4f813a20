"""`opsctl monitor render`: the Prometheus scrape configuration, rules and Grafana dashboard for the inventory's
services and routers (opsctl.monitor.render). Pure: no host is contacted."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opsctl.cli.common import InventoryOpt, JsonOpt, console, emit_json, handle_errors, load_inventory
from opsctl.errors import OpsctlError
from opsctl.monitor.render import MonitorFile, render_monitoring

# Folders whose *.json files opsctl owns: a target no longer rendered is removed, so Prometheus stops scraping it
TARGET_DIRS = ("targets/services", "targets/routers")


def register(app: typer.Typer) -> None:
    monitor = typer.Typer(help="Monitoring for the inventory: Prometheus and Grafana files.", no_args_is_help=True)
    app.add_typer(monitor, name="monitor")

    @monitor.command("render")
    @handle_errors
    def render(
        inventory: InventoryOpt,
        out: Annotated[
            Path | None,
            typer.Option("--out", help="Write the files under OUT (point Prometheus at OUT/prometheus.yml)."),
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Prometheus scrape configuration (file_sd targets per service and router), recording and alert rules
        (thresholds from the inventory's `monitoring:`), a Grafana dashboard. docs/monitoring.md."""
        inv = load_inventory(inventory)
        files = render_monitoring(inv)
        m = inv.monitoring
        if m.runbook_url is None and m.runbook_base_url is None:
            console.print(
                f"note: the alerts' runbook_url is the relative path {m.runbook}, which no Alertmanager receiver "
                "can open: set monitoring.runbook_base_url to the http(s) URL of your docs/ folder"
            )
        if out is not None:
            removed = write_files(out, files)
            console.print(
                f"wrote {len(files)} files to {out}" + (f", removed {removed} stale targets" if removed else "")
            )
        if as_json:
            emit_json({f.path: f.text for f in files})
        elif out is None:
            for f in files:
                typer.echo(f"# ==> {f.path}")
                typer.echo(f.text)


def write_files(out: Path, files: list[MonitorFile]) -> int:
    """Write every file (atomically: a temporary file renamed), then remove the target files of the owned
    folders that this render did not write; returns how many were removed."""
    written = {out / f.path for f in files}
    try:
        for folder in TARGET_DIRS:  # both, even empty: Prometheus watches each folder it is given
            (out / folder).mkdir(parents=True, exist_ok=True)
        for f in files:
            path = out / f.path
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(f.text)
            tmp.replace(path)
        stale = [p for d in TARGET_DIRS if (out / d).is_dir() for p in (out / d).glob("*.json") if p not in written]
        for path in stale:
            path.unlink()
    except OSError as exc:
        raise OpsctlError(f"cannot write {out}: {exc.strerror}", "choose a writable --out directory") from None
    return len(stale)
