"""Pure rendering: (host, service, release id) -> the exact files a host needs and the server's flags. No I/O
except reading the bundled jinja2 templates.

Files per release: `unit` (the systemd unit), `env` (EnvironmentFile, 0600) and `server.yaml` (the server's
flags for `--config`, 0600, holds the API key when one is set). The unit runs
`<venv>/bin/python -m <server module> --config <release>/server.yaml [extra args]`, so no secret is in argv.

Every file is read back before it is returned, by the rules of the program that will read it
(opsctl.systemd for the unit and the EnvironmentFile, YAML for server.yaml): the unit must hold exactly the
intended directives and run exactly the intended argv, the env file must set exactly the intended
variables. A difference is a SystemdSyntaxError, so nothing unintended is ever written to a host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path

import jinja2
import yaml

from opsctl import layout
from opsctl.errors import InventoryError
from opsctl.inventory.model import Engine, Host, PolicyMode, Service
from opsctl.inventory.rules import TEST_HOOK_ENV, TEST_HOOK_HINT, excerpt
from opsctl.secrets import MASK
from opsctl.systemd import SystemdSyntaxError, check_env_file, check_unit, escape_specifiers, quote_env, quote_exec
from opsctl.yamlload import safe_load as yaml_load

TEMPLATES = Path(__file__).parent / "data" / "templates"
SERVER_MODULE = {Engine.SGLANG: "sglang.launch_server", Engine.REFERENCE: "ddtree.serve"}
STOP_TIMEOUT_S = 60
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Comments written above a unit directive.
UNIT_COMMENTS = {
    ("Service", "KillMode"): "SGLang drains without a time bound on SIGTERM: SIGTERM the main process, then "
    "SIGKILL the group."
}


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
        auto_reload=False,  # bundled templates never change under a running opsctl: no stat() per render
    )


# Read-backs that passed, by a digest of everything the check reads (never the texts: server.yaml may hold
# the API key). A fleet renders the same files on many hosts (the 1,100-host inventory: 2 distinct units
# for 2,200 services) and a check is a pure function of its inputs, so a pass is remembered (bounded); a
# refusal is not, so every one is checked and worded as before.
_PASSED: set[bytes] = set()
_PASSED_MAX = 4096


def _checked_once(kind: str, inputs: object, check: Callable[[], None]) -> None:
    key = hashlib.blake2b(repr((kind, inputs)).encode(), digest_size=16).digest()
    if key in _PASSED:
        return
    check()
    if len(_PASSED) >= _PASSED_MAX:
        _PASSED.clear()
    _PASSED.add(key)


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
        # Several GPUs (opsctl.inventory.parallel); single-GPU services keep SGLang's defaults, unrendered.
        options += [(flag, n) for flag, n in (("tp-size", service.tp), ("dp-size", service.dp)) if n > 1]
        if service.nccl_port is not None:
            options.append(("nccl-port", service.nccl_port))
    else:
        options.append(("device", service.device))
    if service.mode.speculative:
        assert service.draft_model is not None  # guaranteed by the inventory loader
        options += [
            ("speculative-algorithm", service.mode.spec.algorithm),
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


def _tree_without_chain_rounds(service: Service) -> bool:
    """A tree service whose policy never runs DFLASH's chain rounds (off, or pinned to a tree). With `auto` or
    `chain` the chain rounds read DFLASH's greedy head: folded into the drafter's graph, as in the H200 run where
    the policy came within 1.4% of the best shape at every batch size (dev/sglang_gpu/cost_bench.py renders no
    eager sampler); eager, the chain rounds run it outside the graph."""
    if not service.mode.spec.verifies_tree:
        return False
    policy = service.ddtree.policy
    return policy.mode is PolicyMode.OFF or (policy.mode is PolicyMode.PINNED and bool(policy.pinned_budget))


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
    eager_head = service.mode.spec.eager_draft_head or _tree_without_chain_rounds(service)
    if service.engine is Engine.SGLANG and eager_head:
        # Shadow reads DFLASH's per-position draft distributions, which SGLang only keeps with the eager draft
        # sampler. Tree builds its trees from the drafter's hidden states: a drafter CUDA graph with DFLASH's
        # greedy head folded in computes that head every round for nothing (0.6-0.8 ms per round on an H200,
        # docs/sglang.md "Cost at real shapes").
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
        if knobs.selfcheck_every and service.sglang_tree:
            env.append(("DDTREE_SELFCHECK_EVERY", str(knobs.selfcheck_every)))
        if knobs.round_graphs_max_bs is not None and service.sglang_tree:
            env.append(("DDTREE_ROUND_GRAPHS_MAX_BS", str(knobs.round_graphs_max_bs)))
        if knobs.policy.mode is not PolicyMode.OFF and service.mode.spec.verifies_tree:  # off: the runtime's default
            env.append(("DDTREE_POLICY", knobs.policy.text))
    env += list(service.extra_env)
    for key, _value in env:  # the inventory refuses them; a Service built in code must not slip one through
        if key in TEST_HOOK_ENV:
            why = f"is a benchmark test hook ({TEST_HOOK_ENV[key]}); opsctl never renders it"
            raise InventoryError(f"services.{service.name}.env.{key}", why, TEST_HOOK_HINT)
    return env


def flags_argv(options: list[tuple[str, object]]) -> tuple[str, ...]:
    argv: list[str] = []
    for key, value in options:
        if value is True:
            argv.append(f"--{key}")
        elif value is not False:
            argv += [f"--{key}", str(value)]
    return tuple(argv)


def unit_directives(service: Service, release_dir: str, exec_start: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """The unit as (section, key, value); ExecStart's value is the command line (each argument quoted)."""
    description = f"opsctl {service.name}: {service.engine.value} {service.mode.value} on port {service.port}"
    identifier = f"opsctl-{service.name}"
    return server_directives(description, release_dir, exec_start, 5, STOP_TIMEOUT_S, identifier)


def server_directives(
    description: str, release_dir: str, exec_start: tuple[str, ...], restart_sec: int, stop_s: int, identifier: str
) -> list[tuple[str, str, str]]:
    """A long-running server from a release dir (a service, a router): restarted on failure, at most 5 starts in
    10 min, its env file, its journal identifier."""
    return [
        ("Unit", "Description", description),
        ("Unit", "After", "network-online.target"),
        ("Unit", "Wants", "network-online.target"),
        ("Unit", "StartLimitIntervalSec", "600"),
        ("Unit", "StartLimitBurst", "5"),
        ("Service", "Type", "simple"),
        ("Service", "WorkingDirectory", release_dir),
        ("Service", "EnvironmentFile", f"{release_dir}/env"),
        ("Service", "ExecStart", " ".join(quote_exec(a) for a in exec_start)),
        ("Service", "Restart", "on-failure"),
        ("Service", "RestartSec", str(restart_sec)),
        ("Service", "KillMode", "mixed"),
        ("Service", "TimeoutStopSec", str(stop_s)),
        ("Service", "LimitNOFILE", "65536"),
        ("Service", "SyslogIdentifier", identifier),
        ("Install", "WantedBy", "multi-user.target"),
    ]


def unit_text(service: Service, release_id: str, directives: list[tuple[str, str, str]]) -> str:
    lines = [f"# Rendered by opsctl for service {service.name}, release {release_id}. Do not edit: redeploy instead."]
    section = ""
    for sec, key, value in directives:
        if sec != section:
            lines += [""] if section else []
            lines.append(f"[{sec}]")
            section = sec
        if (sec, key) in UNIT_COMMENTS:
            lines.append(f"# {UNIT_COMMENTS[sec, key]}")
        lines.append(f"{key}={value if key == 'ExecStart' else escape_specifiers(value)}")
    return "\n".join(lines) + "\n"


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
    what = excerpt(service.name)
    directives = unit_directives(service, release_dir, exec_start)
    unit = unit_text(service, release_id, directives)
    _checked_once(
        "unit", (unit, directives, exec_start), lambda: check_unit(unit, directives, exec_start, f"the unit of {what}")
    )
    context = {"service": service, "release_id": release_id, "release_dir": release_dir}
    env = _environment()
    variables = server_env(host, service, release_dir)
    env_file = env.get_template("env.j2").render(**context, env=[(k, quote_env(v)) for k, v in variables])
    _checked_once(
        "env", (env_file, variables), lambda: check_env_file(env_file, variables, f"the EnvironmentFile of {what}")
    )
    server_config = env.get_template("server.yaml.j2").render(
        **context, module=SERVER_MODULE[service.engine], options=[(k, yaml_scalar(v)) for k, v in options]
    )
    _checked_once(
        "server.yaml",
        (server_config, options),
        lambda: check_server_config(server_config, options, f"the server.yaml of {what}"),
    )
    masked = options if secrets is Secrets.MASK else server_options(host, service, Secrets.MASK)
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


def check_server_config(text: str, options: list[tuple[str, object]], what: str) -> None:
    """The server reads exactly `options` from `text` (YAML, as SGLang's and ddtree's --config do: PyYAML's
    safe_load; libyaml's where it reads the same, 3x faster: rendering 2,200 services spent 2/3 of it here)."""
    try:
        loaded = yaml_load(text)
    except yaml.YAMLError:
        loaded = None
    if loaded != dict(options) or len(options) != len(dict(options)):
        raise SystemdSyntaxError(f"{what}: the server would read other flags", "a bug in opsctl's rendering; report it")


def yaml_scalar(value: object) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a valid YAML scalar, quoting everything that needs it
