"""`opsctl render`: print or write every selected service's files. Pure: no host is contacted."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opsctl import layout
from opsctl.cli.common import (
    HostOpt,
    InventoryOpt,
    JsonOpt,
    ServiceOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)
from opsctl.errors import OpsctlError
from opsctl.inventory.select import select
from opsctl.render import RenderedService, render_service

PREVIEW_RELEASE = "preview"


def register(app: typer.Typer) -> None:
    @app.command("render")
    @handle_errors
    def render(
        inventory: InventoryOpt,
        host: HostOpt = None,
        service: ServiceOpt = None,
        out: Annotated[Path | None, typer.Option("--out", help="Write files to OUT/<host>/<service>/.")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Show exactly what opsctl would put on each host (unit, env, server.yaml), secrets masked."""
        inv = load_inventory(inventory)
        rendered = [
            render_service(h, s, PREVIEW_RELEASE)
            for h, services in select(inv, split_selector(host), split_selector(service))
            for s in services
        ]
        if out is not None:
            for item in rendered:
                _write(out, item)
            console.print(f"wrote {len(rendered)} services to {out}")
        if as_json:
            emit_json([_as_dict(r) for r in rendered])
        elif out is None:
            for item in rendered:
                for file in item.files:
                    typer.echo(f"# ==> {item.host}/{item.service}/{file.name} (mode {file.mode:o})")
                    typer.echo(file.text)


def _write(out: Path, item: RenderedService) -> None:
    folder = out / item.host / item.service
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for file in item.files:
            path = folder / (layout.unit_name(item.service) if file.name == "unit" else file.name)
            path.write_text(file.text)
            path.chmod(file.mode)
    except OSError as exc:
        raise OpsctlError(f"cannot write {folder}: {exc.strerror}", "choose a writable --out directory") from None


def _as_dict(item: RenderedService) -> dict[str, object]:
    return {
        "host": item.host,
        "service": item.service,
        "release_dir": item.release_dir,
        "exec_start": list(item.exec_start),
        "flags": list(item.flags),
        "files": {f.name: {"mode": f"{f.mode:o}", "text": f.text} for f in item.files},
    }
