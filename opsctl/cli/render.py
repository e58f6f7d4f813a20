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
    RouterOpt,
    ServiceOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)
from opsctl.errors import OpsctlError
from opsctl.inventory.select import select, select_routers
from opsctl.render import RenderedService, render_service
from opsctl.router.render import RenderedRouter, render_router

PREVIEW_RELEASE = "preview"


def register(app: typer.Typer) -> None:
    @app.command("render")
    @handle_errors
    def render(
        inventory: InventoryOpt,
        host: HostOpt = None,
        service: ServiceOpt = None,
        out: Annotated[Path | None, typer.Option("--out", help="Write files to OUT/<host>/<service>/.")] = None,
        router: RouterOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Show exactly what opsctl would put on each host (unit, env, server.yaml; a router's unit, env,
        router.json, launch.py), secrets masked. `--router NAME` alone: only routers."""
        inv = load_inventory(inventory)
        routers_only = router is not None and host is None and service is None
        rendered = [] if routers_only else [
            render_service(h, s, PREVIEW_RELEASE)
            for h, services in select(inv, split_selector(host), split_selector(service))
            for s in services
        ]  # fmt: skip
        picked = select_routers(inv, split_selector(router), split_selector(host)) if service is None else []
        routers = [render_router(inv, r, PREVIEW_RELEASE) for r in picked]
        if out is not None:
            for item in rendered:
                _write(out, item)
            for r in routers:
                _write_router(out, r)
            console.print(f"wrote {len(rendered)} services and {len(routers)} routers to {out}")
        if as_json:
            emit_json([_as_dict(r) for r in rendered] + [_router_dict(r) for r in routers])
        elif out is None:
            for item in rendered:
                for file in item.files:
                    typer.echo(f"# ==> {item.host}/{item.service}/{file.name} (mode {file.mode:o})")
                    typer.echo(file.text)
            for r in routers:
                for name, (text, mode) in r.files.items():
                    typer.echo(f"# ==> {r.host}/router-{r.router}/{name} (mode {mode:o})")
                    typer.echo(text)


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


def _write_router(out: Path, item: RenderedRouter) -> None:
    folder = out / item.host / f"router-{item.router}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, (text, mode) in item.files.items():
            path = folder / (layout.unit_name(f"router-{item.router}") if name == "unit" else name)
            path.write_text(text)
            path.chmod(mode)
    except OSError as exc:
        raise OpsctlError(f"cannot write {folder}: {exc.strerror}", "choose a writable --out directory") from None


def _router_dict(item: RenderedRouter) -> dict[str, object]:
    return {
        "host": item.host,
        "router": item.router,
        "release_dir": item.release_dir,
        "exec_start": list(item.exec_start),
        "argv": list(item.argv),
        "files": {name: {"mode": f"{mode:o}", "text": text} for name, (text, mode) in item.files.items()},
    }
