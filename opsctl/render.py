"""Pure rendering: (host, service, release id) -> the exact files a host needs and the server's flags. No I/O
except reading the bundled jinja2 templates.

Files per release: `unit` (the systemd unit), `env` (EnvironmentFile, 0600) and `server.yaml` (the server's
flags for `--config`, 0600, holds the API key when one is set). The unit runs
`<venv>/bin/python -m <server module> --config <release>/server.yaml [extra args]`, so no secret is in argv.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

import jinja2

from opsctl import layout
from opsctl.inventory.model import Engine, Host, Mode, Service
from opsctl.secrets import MASK

TEMPLATES = Path(__file__).parent / "data" / "templates"
SERVER_MODULE = {Engine.SGLANG: "sglang.launch_server", Engine.REFERENCE: "ddtree.serve"}
STOP_TIMEOUT_S = 60
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9._=:/,+@-]+$")


class Secrets(StrEnum):
    MASK = "mask"  # previews (render, --plan, --json): the API key shows as ***
    REVEAL = "reveal"  # what deploy writes to the host's 0600 files


@dataclass(frozen=True)
class RenderedFile:
    name: str
    text: str
    mode: int


@dataclass(frozen=True)
class RenderedService:
    host: str
    service: str
    release_id: str
    release_dir: str
    unit: str
    env: str
    server_config: str
    flags: tuple[str, ...]  # the server's resolved flags in argv form (API key as ***)
    exec_start: tuple[str, ...]

    @property
    def files(self) -> tuple[RenderedFile, ...]:
        return (
            RenderedFile("unit", self.unit, 0o644),
            RenderedFile("env", self.env, 0o600),
            RenderedFile("server.yaml", self.server_config, 0o600),
        )


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def server_options(host: Host, service: Service, secrets: Secrets = Secrets.MASK) -> list[tuple[str, object]]:
    """The server's flags as (name without --, value); booleans are switches. Same names for both engines."""
    options: list[tuple[str, object]] = [
        ("model-path", service.model.path),
        ("host", service.bind),
        ("port", service.port),
        ("dtype", service.dtype),
    ]
    if service.served_model_name:
        options.append(("served-model-name", service.served_model_name))
    if service.engine is Engine.SGLANG:
        options.append(("enable-metrics", True))
    else:
        options.append(("device", service.device))
    if service.mode.speculative:
        assert service.draft_model is not None  # guaranteed by the inventory loader
        algorithm = "DFLASH" if service.mode is Mode.LINEAR else "DDTREE"
        options += [
            ("speculative-algorithm", algorithm),
            ("speculative-draft-model-path", service.draft_model.path),
        ]
    if service.mode.ddtree:
        # DDTREE has no overlap support, commits single KV slots and needs a backend that takes a tree mask.
        options += [
            ("disable-overlap-schedule", True),
            ("page-size", 1),
            ("attention-backend", service.attention_backend),
        ]
    if service.sglang_eager_verify:
        options.append(("disable-cuda-graph", True))
    if service.api_key is not None:
        options.append(("api-key", service.api_key.reveal() if secrets is Secrets.REVEAL else MASK))
    return options


def server_env(host: Host, service: Service, release_dir: str) -> list[tuple[str, str]]:
    env: list[tuple[str, str]] = [("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in service.gpus))]
    path = f"{host.venv}/bin:{SYSTEM_PATH}"
    if host.cuda is not None:
        env.append(("CUDA_HOME", host.cuda.home))
        path = f"{host.cuda.home}/bin:{path}"
    env += [
        ("PATH", path),
        # The runtime is installed per release, so a rollback also rolls back the runtime.
        ("PYTHONPATH", f"{release_dir}/site"),
        ("SGLANG_CACHE_DIR", f"{layout.SGLANG_CACHE_ROOT}/{service.name}"),
        ("HF_HUB_OFFLINE", "1"),
    ]
    if service.engine is Engine.SGLANG and service.mode is Mode.SHADOW:
        # The shadow worker reads DFLASH's per-position draft distributions, which SGLang only keeps with the
        # eager draft sampler (docs/sglang.md).
        env.append(("SGLANG_DFLASH_EAGER_DRAFT_SAMPLER", "1"))
    if service.mode.ddtree:
        knobs = service.ddtree
        env += [
            ("DDTREE_VERIFY", service.mode.value),
            ("DDTREE_BUDGET", str(knobs.budget)),
            ("DDTREE_TOPK", str(knobs.topk)),
            ("DDTREE_ALLOW_HYBRID_UNSAFE", "1" if knobs.allow_hybrid_unsafe else "0"),
            ("DDTREE_LOG_INTERVAL", str(knobs.log_interval)),
        ]
    env += list(service.extra_env)
    return env


def flags_argv(options: list[tuple[str, object]]) -> tuple[str, ...]:
    argv: list[str] = []
    for key, value in options:
        if value is True:
            argv.append(f"--{key}")
        elif value is not False:
            argv += [f"--{key}", str(value)]
    return tuple(argv)


def render_service(host: Host, service: Service, release_id: str, secrets: Secrets = Secrets.MASK) -> RenderedService:
    release_dir = layout.release_dir(service.name, release_id)
    options = server_options(host, service, secrets)
    exec_start = (
        f"{host.venv}/bin/python",
        "-m",
        SERVER_MODULE[service.engine],
        "--config",
        f"{release_dir}/server.yaml",
        *service.extra_args,
    )
    context = {"service": service, "release_id": release_id, "release_dir": release_dir}
    env = _environment()
    unit = env.get_template("unit.service.j2").render(
        **context, exec_start=" ".join(systemd_quote(a) for a in exec_start), stop_timeout=STOP_TIMEOUT_S
    )
    env_file = env.get_template("env.j2").render(
        **context, env=[(k, env_quote(v)) for k, v in server_env(host, service, release_dir)]
    )
    server_config = env.get_template("server.yaml.j2").render(
        **context, module=SERVER_MODULE[service.engine], options=[(k, yaml_scalar(v)) for k, v in options]
    )
    masked = server_options(host, service, Secrets.MASK)
    return RenderedService(
        host=host.name,
        service=service.name,
        release_id=release_id,
        release_dir=release_dir,
        unit=unit,
        env=env_file,
        server_config=server_config,
        flags=flags_argv(masked),
        exec_start=exec_start,
    )


def systemd_quote(arg: str) -> str:
    if _SYSTEMD_SAFE.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


def env_quote(value: str) -> str:
    """EnvironmentFile value: bare when safe, else double-quoted with backslash escapes."""
    if value == "" or _SYSTEMD_SAFE.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


def yaml_scalar(value: object) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a valid YAML scalar, quoting everything that needs it
