"""Pure rendering of a router release: (inventory, router, release id) -> the files its host needs. No I/O.

Files per release (under /opt/opsctl/services/router-<name>/releases/<id>/):
- `unit`: opsctl-router-<name>.service, running `<venv>/bin/python <release>/launch.py <release>/router.json
  <kept-out file>` with PYTHONPATH=<release>/site (sglang-router and its dependencies, installed per release);
- `router.json` (0600): the router's argv, the only file that holds the API key;
- `launch.py`: a few lines that read router.json, leave out of `--worker-urls` the workers of the kept-out file
  (opsctl.router.keptout), and call sglang_router's own `parse_router_args` and `launch_router` in-process.
  sglang-router 0.3.2 takes its API key only as `--api-key` on the command line, which every user of the host
  could read in /proc; so no secret is ever in a process's argv.

Every file is read back (systemd's rules for the unit, JSON for router.json) before it is returned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from opsctl import layout
from opsctl.inventory.model import Host, Inventory, Router
from opsctl.render import SYSTEM_PATH, Secrets, server_directives
from opsctl.router.keptout import kept_out_file
from opsctl.secrets import MASK
from opsctl.systemd import SystemdSyntaxError, check_env_file, check_unit, escape_specifiers, quote_env

STOP_TIMEOUT_S = 30
SHUTDOWN_GRACE_S = 10  # the router's own wait for in-flight requests on SIGTERM (its default is 180 s)
WORKER_STARTUP_TIMEOUT_S = 600  # a worker named at start that is still loading its model
LAUNCHER = '''\
"""Written by opsctl: start sglang-router with the argv in router.json (0600), so no secret is in argv, leaving
out of --worker-urls the workers listed in the kept-out file (opsctl.router.keptout): workers whose deploy has not
passed its gates, so a router restarted mid-deploy does not route to them."""
import json
import sys

from sglang_router.launch_router import launch_router, parse_router_args

with open(sys.argv[1], encoding="utf-8") as f:
    argv = json.load(f)["argv"]
try:
    with open(sys.argv[2], encoding="utf-8") as f:
        kept_out = set(json.load(f)["kept_out"])
except (OSError, ValueError, KeyError, TypeError):  # none written (the usual case), or unreadable: keep nobody out
    kept_out = set()
if kept_out:
    start = argv.index("--worker-urls") + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    left = [url for url in argv[start:end] if url in kept_out]
    argv = argv[:start] + [url for url in argv[start:end] if url not in kept_out] + argv[end:]
    print(f"opsctl: kept out of this router until their deploy passes its gates: {' '.join(left)}", flush=True)
launch_router(parse_router_args(argv))
'''


@dataclass(frozen=True)
class RenderedRouter:
    router: str
    host: str
    release_id: str
    release_dir: str
    unit: str
    env: str
    config: str  # router.json
    argv: tuple[str, ...]  # the router's flags (API key as ***)
    exec_start: tuple[str, ...]

    @property
    def files(self) -> dict[str, tuple[str, int]]:
        """name -> (text, mode); `unit` is written as opsctl-router-<name>.service."""
        return {
            "unit": (self.unit, 0o644),
            "env": (self.env, 0o600),
            "router.json": (self.config, 0o600),
            "launch.py": (LAUNCHER, 0o644),
        }


def worker_url(host: Host, port: int) -> str:
    address = host.address
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"http://{address}:{port}"


def worker_urls(inventory: Inventory, router: Router) -> tuple[str, ...]:
    out = []
    for ref in router.workers:
        host = inventory.host(ref.host)
        out.append(worker_url(host, host.service(ref.service).port))
    return tuple(out)


def router_url(inventory: Inventory, router: Router) -> str:
    """Where clients (and opsctl) reach the router."""
    return worker_url(inventory.host(router.host), router.port)


def router_argv(inventory: Inventory, router: Router, secrets: Secrets = Secrets.MASK) -> tuple[str, ...]:
    argv = [
        "--host", router.bind,
        "--port", str(router.port),
        "--policy", router.policy.value,
        "--worker-urls", *worker_urls(inventory, router),
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(router.health_check_interval),
        "--worker-startup-timeout-secs", str(WORKER_STARTUP_TIMEOUT_S),
        "--worker-startup-check-interval", "2",
        "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S),
        "--prometheus-host", router.bind,
        "--prometheus-port", str(router.prometheus_port),
        "--log-level", "info",
    ]  # fmt: skip
    if router.api_key is not None:
        argv += ["--api-key", router.api_key.reveal() if secrets is Secrets.REVEAL else MASK]
    return tuple(argv)


def router_env(host: Host, release_dir: str) -> list[tuple[str, str]]:
    return [
        ("PATH", f"{host.venv}/bin:{SYSTEM_PATH}"),
        ("PYTHONPATH", f"{release_dir}/site"),
        ("PYTHONUNBUFFERED", "1"),
    ]


def unit_directives(router: Router, release_dir: str, exec_start: tuple[str, ...]) -> list[tuple[str, str, str]]:
    description = f"opsctl router {router.name}: sglang-router {router.version} on port {router.port}"
    identifier = router.unit_name.removesuffix(".service")
    return server_directives(description, release_dir, exec_start, 2, STOP_TIMEOUT_S, identifier)


def render_router(
    inventory: Inventory, router: Router, release_id: str, secrets: Secrets = Secrets.MASK
) -> RenderedRouter:
    host = inventory.host(router.host)
    release_dir = layout.release_dir(router.unit_base, release_id)
    exec_start = (
        f"{host.venv}/bin/python", f"{release_dir}/launch.py", f"{release_dir}/router.json",
        kept_out_file(router.name),
    )  # fmt: skip
    directives = unit_directives(router, release_dir, exec_start)
    lines = [f"# Rendered by opsctl for router {router.name}, release {release_id}. Do not edit: redeploy instead."]
    section = ""
    for sec, key, value in directives:
        if sec != section:
            lines += [""] if section else []
            lines.append(f"[{sec}]")
            section = sec
        lines.append(f"{key}={value if key == 'ExecStart' else escape_specifiers(value)}")
    unit = "\n".join(lines) + "\n"
    check_unit(unit, directives, exec_start, f"the unit of router {router.name}")
    variables = router_env(host, release_dir)
    env = "".join(f"{k}={quote_env(v)}\n" for k, v in variables)
    check_env_file(env, variables, f"the EnvironmentFile of router {router.name}")
    argv = router_argv(inventory, router, secrets)
    config = json.dumps({"argv": list(argv)}, indent=1) + "\n"
    if json.loads(config) != {"argv": list(argv)}:
        raise SystemdSyntaxError(f"router.json of {router.name} would read other flags", "a bug in opsctl; report it")
    return RenderedRouter(
        router=router.name,
        host=host.name,
        release_id=release_id,
        release_dir=release_dir,
        unit=unit,
        env=env,
        config=config,
        argv=router_argv(inventory, router, Secrets.MASK),
        exec_start=exec_start,
    )
