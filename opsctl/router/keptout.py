"""The workers opsctl keeps out of a router, recorded on the router's host: the router's start reads them.

sglang-router takes its members from `--worker-urls` when it starts. While a worker's deploy runs its gates, opsctl
takes it out over the router's API; a router that restarts meanwhile (systemd's Restart=, a crash, a kill) would
start with every worker of its flags, the ungated one included, and route to it until opsctl's membership watcher
took it out again (0.3-0.5 s measured). The router's launcher (opsctl.router.render.LAUNCHER) leaves out the URLs
listed in this file, so a restarted router starts with the members opsctl wants.

opsctl.router.rolling writes the file before it takes a worker out and before it puts one back, so the file never
lists fewer workers than the router is kept from; a worker left out because it serves nothing healthy stays in
the file, as it stays out of the router. `opsctl status --router` shows the file's workers; `router remove` deletes
it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable

from opsctl.commands import Cmd
from opsctl.inventory.model import Host, Inventory, Router
from opsctl.remote.base import Connection
from opsctl.remote.held import HeldConnections

KEPT_OUT_DIR = "/var/lib/opsctl/routers"


def kept_out_file(router: str) -> str:
    return f"{KEPT_OUT_DIR}/{router}.kept-out.json"


def kept_out_json(urls: Iterable[str]) -> str:
    return json.dumps({"kept_out": sorted(set(urls))}) + "\n"


def parse_kept_out(text: str) -> tuple[str, ...]:
    """The URLs of a kept-out file; () when it is absent, empty or not what opsctl writes (as the launcher reads
    it: an unreadable file keeps nobody out)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return ()
    urls = data.get("kept_out") if isinstance(data, dict) else None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        return ()
    return tuple(urls)


class KeptOutRecorder:
    """Keeps a router's kept-out file on its host over SSH: read, change one URL, write (one connection per
    host, kept until `close`; one change at a time per process)."""

    def __init__(self, inventory: Inventory, connect: Callable[[Host], Connection] | None = None) -> None:
        if connect is None:
            from opsctl.remote import connect as ssh_connect

            connect = ssh_connect
        self._conns = HeldConnections(inventory, connect)
        self._lock = threading.Lock()

    def keep_out(self, router: Router, url: str) -> None:
        """Raises OpsctlError when the host cannot be read or written (the caller says so and goes on)."""
        self._change(router, lambda urls: urls | {url})

    def let_in(self, router: Router, url: str) -> None:
        self._change(router, lambda urls: urls - {url})

    def _change(self, router: Router, change: Callable[[set[str]], set[str]]) -> None:
        with self._lock:
            conn = self._conns.get(router.host)
            path = kept_out_file(router.name)
            before = set(parse_kept_out(conn.run(Cmd.of("cat", "--", path), check=False, timeout=30).stdout))
            after = change(before)
            if after == before:
                return
            conn.run(Cmd.of("mkdir", "-p", "--", KEPT_OUT_DIR, sudo=True), timeout=30)
            conn.put_text(kept_out_json(after), path, 0o644)

    def close(self) -> None:
        self._conns.close()
