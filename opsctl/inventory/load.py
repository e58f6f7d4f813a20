"""Load an inventory YAML file and validate it, once, into frozen typed objects (opsctl.inventory.model).

Every error is an InventoryError naming the key path (`hosts.ct200.services.gpu1.port: ...`).
Layout: `defaults:` (ssh, venv, python, sglang_version, cuda, wheelhouse, service) and `hosts:`; each host
may override any default; `defaults.service` holds defaults for every service. docs/inventory.md is the
reference for every key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from opsctl.errors import InventoryError
from opsctl.inventory import credfiles
from opsctl.inventory import schema as s
from opsctl.inventory.model import (
    SGLANG_DRAFT_BLOCK,
    SMOKE_PROMPT,
    CudaConfig,
    DDTreeKnobs,
    DDTreePolicy,
    Engine,
    Host,
    HostKeyPolicy,
    Inventory,
    Mode,
    ModelSourceKind,
    ModelSpec,
    PolicyMode,
    Service,
    SshConfig,
)
from opsctl.inventory.monitoring import parse_monitoring
from opsctl.inventory.origin import inherited
from opsctl.inventory.parallel import check_port_clashes, parallel
from opsctl.inventory.reader import MAX_DEPTH, read_file
from opsctl.inventory.routers import parse_routers
from opsctl.inventory.rules import (
    SECRET_HINT,
    TEST_HOOK_ENV,
    TEST_HOOK_HINT,
    Kind,
    clean,
    excerpt,
    secret_flag,
    token_kind,
)
from opsctl.secrets import SecretRef


class _Device(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"


class _Dtype(StrEnum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


HOST_SCALARS = {"venv", "python", "sglang_version", "cuda", "wheelhouse"}
SSH_KEYS = {
    "user",
    "port",
    "key_file",
    "known_hosts_file",
    "host_key_policy",
    "jump_host",
    "connect_timeout",
    "command_timeout",
    "connect_retries",
    "keepalive",
}
SERVICE_KEYS = {
    "gpus",
    "port",
    "mode",
    "engine",
    "model",
    "draft_model",
    "ddtree",
    "bind",
    "served_model_name",
    "attention_backend",
    "device",
    "dtype",
    "api_key",
    "extra_args",
    "extra_env",
    "health_timeout",
    "readiness_delay",
    "tp",
    "dp",
    "nccl_port",
    "smoke_prompt",
}
SERVICE_DEFAULT_KEYS = SERVICE_KEYS - {"gpus", "port", "model", "draft_model", "nccl_port"}
# Environment variables opsctl renders itself; extra_env may not override them.
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "PYTHONPATH", "CUDA_HOME", "PATH", "SGLANG_API_KEY"}
SECRET_HINTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
DEFAULT_VENV = "/opt/opsctl/venv"
DEFAULT_SGLANG = "0.5.23"


@dataclass(frozen=True)
class Override:
    """A command-line change to a service key (`opsctl deploy --mode tree`), made to the inventory's data
    before validation: the overridden inventory passes the same rules and gets the same warnings as a file
    that says the same. `hosts`/`services` None means every one."""

    key: str  # a service key, e.g. "mode"
    value: Any  # as it would be written in the YAML
    flag: str  # the option that set it, named in messages: "--mode tree"
    hosts: tuple[str, ...] | None = None
    services: tuple[str, ...] | None = None


def load_inventory(path: str | Path, overrides: Sequence[Override] = ()) -> Inventory:
    """Read, override and validate an inventory file: one InventoryError, or a typed Inventory."""
    file = Path(path)
    data = read_file(file)
    shown = clean(str(file), 120)
    if data is None:
        raise InventoryError("", f"{shown}: the inventory is empty", "it needs at least a `hosts:` mapping")
    inventory = parse_inventory(data, str(file), base_dir=file.parent, overrides=overrides, read=True)
    where = str(file.resolve())
    return replace(inventory, hosts=tuple(replace(h, inventory=where) for h in inventory.hosts))


def parse_inventory(
    data: Any,
    source: str = "<inventory>",
    base_dir: Path | None = None,
    overrides: Sequence[Override] = (),
    read: bool = False,
) -> Inventory:
    """Validate plain data (from `reader.read_file`, or built in code) into a typed Inventory. `read`: the data
    came from the reader, which already refused every token-shaped key and string (and too deep a nesting)
    while building it, so the walk below would find nothing (a tenth of loading a 1 MiB inventory)."""
    if not read:
        _refuse_tokens(data, "", 0)
    if not overrides:
        return _inventory(data, source, base_dir)
    try:
        return _inventory(apply_overrides(data, overrides), source, base_dir)
    except InventoryError as exc:
        given = ", ".join(o.flag for o in overrides)
        raise InventoryError(exc.path, f"{exc.detail} (with {given})", exc.hint) from None


def apply_overrides(data: Any, overrides: Sequence[Override]) -> Any:
    """A copy of `data` with each override written into the services it selects. Data of the wrong shape is
    returned as it is: validation then names the problem."""
    hosts = data.get("hosts") if isinstance(data, dict) else None
    if not isinstance(hosts, dict):
        return data
    new_hosts: dict[Any, Any] = {}
    for host_name, host in hosts.items():
        services = host.get("services") if isinstance(host, dict) else None
        if isinstance(services, dict):
            new_services = {}
            for name, svc in services.items():
                for o in overrides:
                    chosen = (o.hosts is None or host_name in o.hosts) and (o.services is None or name in o.services)
                    if chosen and isinstance(svc, dict):
                        svc = {**svc, o.key: o.value}
                new_services[name] = svc
            host = {**host, "services": new_services}
        new_hosts[host_name] = host
    return {**data, "hosts": new_hosts}


def _refuse_tokens(value: Any, path: str, depth: int) -> None:
    """A token-shaped literal anywhere (key or value) is refused, naming where but never showing it."""
    if depth > MAX_DEPTH:
        raise InventoryError(path, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        kind = token_kind(value)
        if kind is not None:
            raise InventoryError(path, f"looks like a literal secret ({kind})", SECRET_HINT)
    elif isinstance(value, dict):
        for key, item in value.items():
            kind = token_kind(key) if isinstance(key, str) else None
            if kind is not None:
                raise InventoryError(path, f"a key looks like a literal secret ({kind})", SECRET_HINT)
            _refuse_tokens(item, s.join(path, key if isinstance(key, str) else excerpt(key)), depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_tokens(item, s.join(path, index), depth + 1)


def _inventory(data: Any, source: str, base_dir: Path | None) -> Inventory:
    top = s.mapping(data, "", {"defaults", "hosts", "routers", "monitoring", credfiles.KEY}, {"hosts"})
    defaults = s.mapping(top.get("defaults"), "defaults", HOST_SCALARS | {"ssh", "service"})
    hosts_data = s.mapping(top["hosts"], "hosts", set(top["hosts"] or {}) if isinstance(top["hosts"], dict) else set())
    if not hosts_data:
        raise InventoryError("hosts", "no hosts defined", "add at least one host")
    warnings: list[str] = []
    shared: dict[str, Any] = {}  # sections read from `defaults:` alone, validated for the first host that uses them
    hosts = tuple(
        _inherited_host(s.name(key, "hosts"), value, defaults, base_dir or Path("."), warnings, shared)
        for key, value in hosts_data.items()
    )
    addresses: dict[tuple[str, int], str] = {}
    for host in hosts:
        seen = addresses.setdefault((host.address, host.ssh.port), host.name)
        if seen != host.name:
            raise InventoryError(f"hosts.{host.name}.address", f"{host.address} is already used by host {seen}")
    routers = parse_routers(top["routers"], hosts) if top.get("routers") is not None else ()
    monitoring = parse_monitoring(top.get("monitoring"))
    inventory = Inventory(path=source, hosts=hosts, warnings=tuple(warnings), routers=routers, monitoring=monitoring)
    policy = s.choice(top.get(credfiles.KEY, "refuse"), credfiles.KEY, credfiles.CredentialFiles)
    loose = credfiles.find_loose(inventory)
    if loose and policy is credfiles.CredentialFiles.REFUSE:
        raise InventoryError(loose[0].where, loose[0].reason, loose[0].fix)
    if loose:
        extra = tuple(f"{f.where}: {f.reason}: {f.fix}" for f in loose)
        inventory = replace(inventory, warnings=inventory.warnings + extra)
    return inventory


def _merged(defaults: dict[str, Any], own: dict[str, Any], key: str) -> Any:
    """A host's own value, else the default. Mappings merge one level deep (host keys win)."""
    if key in own and key in defaults and isinstance(own[key], dict) and isinstance(defaults[key], dict):
        return {**defaults[key], **own[key]}
    return own.get(key, defaults.get(key))


def _inherited_host(
    name: str, value: Any, defaults: dict[str, Any], base_dir: Path, warnings: list[str], shared: dict[str, Any]
) -> Host:
    """`_host`, with errors about values taken from `defaults:` reported under `defaults.` (origin.py)."""
    path = f"hosts.{name}"
    with inherited(path, value, {k: v for k, v in defaults.items() if k != "service"}, "defaults"):
        return _host(name, value, defaults, path, base_dir, warnings, shared)


def _once(shared: dict[str, Any], key: str, own: dict[str, Any], parse: Callable[[], Any]) -> Any:
    """`parse()`, remembered in `shared` when the host has no `key` of its own: a section taken from
    `defaults:` alone reads the same for every host (only successes are kept, so errors are unchanged)."""
    if key in own:
        return parse()
    if key not in shared:
        shared[key] = parse()
    return shared[key]


def _host(
    name: str,
    value: Any,
    defaults: dict[str, Any],
    path: str,
    base_dir: Path,
    warnings: list[str],
    shared: dict[str, Any],
) -> Host:
    data = s.mapping(value, path, HOST_SCALARS | {"address", "gpus", "ssh", "services"}, {"address"})
    address = s.string(data["address"], f"{path}.address", Kind.ADDRESS)
    gpu_count = s.integer(data.get("gpus", 0), f"{path}.gpus", 0, 64)
    ssh_path = f"{path}.ssh" if "ssh" in data else "defaults.ssh"
    ssh = _once(shared, "ssh", data, lambda: _ssh(_merged(defaults, data, "ssh"), ssh_path))
    venv = s.abs_path(_merged(defaults, data, "venv") or DEFAULT_VENV, f"{path}.venv")
    python = s.string(_merged(defaults, data, "python") or "python3", f"{path}.python", Kind.COMMAND)
    pin = s.string(_merged(defaults, data, "sglang_version") or DEFAULT_SGLANG, f"{path}.sglang_version", Kind.VERSION)
    cuda_raw = _merged(defaults, data, "cuda")
    cuda = _once(shared, "cuda", data, lambda: _cuda(cuda_raw, f"{path}.cuda") if cuda_raw is not None else None)
    wheelhouse_raw = _merged(defaults, data, "wheelhouse")
    wheelhouse = _local_path(wheelhouse_raw, f"{path}.wheelhouse", base_dir) if wheelhouse_raw else None
    service_defaults = s.mapping(defaults.get("service"), "defaults.service", SERVICE_DEFAULT_KEYS)
    services_data = data.get("services") or {}
    if not isinstance(services_data, dict):
        raise InventoryError(f"{path}.services", f"expected a mapping of services, got {s.describe(services_data)}")
    services = []
    for key, v in services_data.items():
        at, own = f"{path}.services.{key}", s.mapping(v, f"{path}.services.{key}", SERVICE_KEYS, {"port", "model"})
        with inherited(at, own, service_defaults, "defaults.service"):
            svc = _service(
                s.name(key, f"{path}.services"), {**service_defaults, **own}, name, gpu_count, at, base_dir, warnings
            )
        services.append(svc)
    _check_clashes(tuple(services), gpu_count, path)
    return Host(
        name=name,
        address=address,
        ssh=ssh,
        gpu_count=gpu_count,
        venv=venv,
        python=python,
        sglang_version=pin,
        cuda=cuda,
        wheelhouse=wheelhouse,
        services=tuple(services),
    )


def _ssh(value: Any, path: str) -> SshConfig:
    d = s.mapping(value, path, SSH_KEYS)
    base = SshConfig()
    return SshConfig(
        user=s.string(d.get("user", base.user), f"{path}.user", Kind.USER),
        port=s.integer(d.get("port", base.port), f"{path}.port", 1, 65535),
        key_file=s.string(d["key_file"], f"{path}.key_file", Kind.CONTROL_PATH) if d.get("key_file") else None,
        known_hosts_file=s.string(
            d.get("known_hosts_file", base.known_hosts_file), f"{path}.known_hosts_file", Kind.CONTROL_PATH
        ),
        host_key_policy=s.choice(
            d.get("host_key_policy", base.host_key_policy.value), f"{path}.host_key_policy", HostKeyPolicy
        ),
        jump_host=s.string(d["jump_host"], f"{path}.jump_host", Kind.JUMP_HOST) if d.get("jump_host") else None,
        connect_timeout=s.number(d.get("connect_timeout", base.connect_timeout), f"{path}.connect_timeout", 0.1, 600),
        command_timeout=s.number(d.get("command_timeout", base.command_timeout), f"{path}.command_timeout", 1, 86400),
        connect_retries=s.integer(d.get("connect_retries", base.connect_retries), f"{path}.connect_retries", 1, 20),
        keepalive=s.integer(d.get("keepalive", base.keepalive), f"{path}.keepalive", 0, 3600),
    )


def _cuda(value: Any, path: str) -> CudaConfig:
    d = s.mapping(value, path, {"toolkit_package", "home", "min_driver", "driver_package"})
    base = CudaConfig()
    return CudaConfig(
        toolkit_package=s.string(
            d.get("toolkit_package", base.toolkit_package), f"{path}.toolkit_package", Kind.PACKAGE
        ),
        home=s.abs_path(d.get("home", base.home), f"{path}.home"),
        min_driver=s.integer(d.get("min_driver", base.min_driver), f"{path}.min_driver", 400, 9999),
        driver_package=s.string(d.get("driver_package", base.driver_package), f"{path}.driver_package", Kind.PACKAGE),
    )


def _local_path(value: Any, path: str, base_dir: Path) -> str:
    text = s.string(value, path, Kind.CONTROL_PATH)
    resolved = Path(text).expanduser()
    if not resolved.is_absolute():
        resolved = (base_dir / resolved).resolve()
    return str(resolved)


def _model(value: Any, path: str, base_dir: Path) -> ModelSpec:
    d = s.mapping(value, path, {"source", "source_on", "path", "hybrid"}, {"source", "path"})
    source_on = s.choice(d.get("source_on", "control"), f"{path}.source_on", ModelSourceKind)
    if source_on is ModelSourceKind.HOST:
        source = s.abs_path(d["source"], f"{path}.source")
    else:
        source = _local_path(d["source"], f"{path}.source", base_dir)
    dest = s.abs_path(d["path"], f"{path}.path")
    if not dest.startswith("/dev/shm/") or dest == "/dev/shm/":
        raise InventoryError(f"{path}.path", f"{excerpt(dest)} must be a directory under /dev/shm/")
    if "hybrid" in d:
        hybrid = s.boolean(d["hybrid"], f"{path}.hybrid")
    else:
        hybrid = _detect_hybrid(source if source_on is ModelSourceKind.CONTROL else None, dest)
    return ModelSpec(source=source, source_on=source_on, path=dest, hybrid=hybrid)


HYBRID_MODEL_TYPES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_next"}


def _detect_hybrid(local_source: str | None, dest: str) -> bool:
    """Hybrid if config.json has linear-attention layers; else guess from the name (Qwen3.5/3.6)."""
    if local_source is not None:
        config_file = Path(local_source) / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            text = config.get("text_config", config)
            layer_types = text.get("layer_types") or []
            return "linear_attention" in layer_types or text.get("model_type") in HYBRID_MODEL_TYPES
    lowered = dest.lower()
    return any(tag in lowered for tag in ("qwen3.5", "qwen3.6", "qwen3_5", "qwen3-next", "qwen3_next"))


def _ddtree(value: Any, path: str) -> DDTreeKnobs:
    if isinstance(value, dict) and "replay_acceptance" in value:
        why = TEST_HOOK_ENV["DDTREE_REPLAY_ACCEPTANCE"]
        raise InventoryError(f"{path}.replay_acceptance", f"is a benchmark test hook ({why})", TEST_HOOK_HINT)
    keys = {"budget", "topk", "allow_hybrid_unsafe", "log_interval", "selfcheck_every", "policy", "round_graphs_max_bs"}
    d = s.mapping(value, path, keys)
    base = DDTreeKnobs()
    budget = s.integer(d.get("budget", base.budget), f"{path}.budget", 1, 1024)
    return DDTreeKnobs(
        budget=budget,
        topk=s.integer(d.get("topk", base.topk), f"{path}.topk", 1, 64),
        allow_hybrid_unsafe=s.boolean(d.get("allow_hybrid_unsafe", False), f"{path}.allow_hybrid_unsafe"),
        log_interval=s.integer(d.get("log_interval", base.log_interval), f"{path}.log_interval", 1, 1_000_000),
        selfcheck_every=s.integer(
            d.get("selfcheck_every", base.selfcheck_every), f"{path}.selfcheck_every", 0, 1_000_000
        ),
        policy=_policy(d.get("policy", base.policy.text), f"{path}.policy", budget),
        round_graphs_max_bs=(
            None
            if d.get("round_graphs_max_bs") is None
            else s.integer(d["round_graphs_max_bs"], f"{path}.round_graphs_max_bs", 0, 1024)
        ),
    )


_TREE_N = re.compile(r"tree([1-9][0-9]{0,3})")


def _policy(value: Any, path: str, budget: int) -> DDTreePolicy:
    """off | auto | chain | tree<N> with 1 <= N <= budget (the verify window is sized for the budget)."""
    expected = f"expected off, auto, chain or tree<N> (1 <= N <= budget {budget})"
    if not isinstance(value, str):
        raise InventoryError(path, f"{expected}, got {s.describe(value)}")
    if value in (PolicyMode.OFF.value, PolicyMode.AUTO.value):
        return DDTreePolicy(PolicyMode(value))
    if value == "chain":
        return DDTreePolicy(PolicyMode.PINNED, 0)
    match = _TREE_N.fullmatch(value)
    if match is None:
        raise InventoryError(path, f"{expected}, got {excerpt(value)}")
    n = int(match.group(1))
    if n > budget:
        raise InventoryError(path, f"{value} is larger than ddtree.budget {budget}", "pin tree<N> with N <= budget")
    return DDTreePolicy(PolicyMode.PINNED, n)


def _secret(value: Any, path: str) -> SecretRef:
    if not isinstance(value, str) or not SecretRef.is_reference(value):
        raise InventoryError(path, "literal secrets are not allowed", "write env:NAME or file:PATH instead")
    return SecretRef(value)


def _service(
    name: str, d: dict[str, Any], host: str, gpu_count: int, path: str, base_dir: Path, warnings: list[str]
) -> Service:
    mode = s.choice(d.get("mode", "baseline"), f"{path}.mode", Mode)
    engine = s.choice(d.get("engine", "sglang"), f"{path}.engine", Engine)
    gpus = tuple(
        s.integer(g, s.join(f"{path}.gpus", i), 0, 63)
        for i, g in enumerate(s.string_list(d.get("gpus", []), f"{path}.gpus"))
    )
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise InventoryError(f"{path}.gpus", f"GPU {twice[0]} is listed twice", "list each GPU index once")
    model = _model(d["model"], f"{path}.model", base_dir)
    draft = _model(d["draft_model"], f"{path}.draft_model", base_dir) if d.get("draft_model") else None
    if mode.speculative and draft is None:
        raise InventoryError(f"{path}.draft_model", f"mode {mode.value} needs a draft model (the DFlash drafter)")
    knobs = _ddtree(d.get("ddtree"), f"{path}.ddtree")
    device = s.choice(d.get("device", "cuda" if engine is Engine.SGLANG else "cpu"), f"{path}.device", _Device)
    if engine is Engine.SGLANG and device is _Device.CPU:
        raise InventoryError(
            f"{path}.device",
            "the sglang engine needs a GPU (device: cuda)",
            "use engine: reference for CPU services",
        )
    if device is _Device.CUDA and not gpus:
        raise InventoryError(f"{path}.gpus", "a GPU service needs at least one GPU index")
    if device is _Device.CPU and gpus:
        raise InventoryError(f"{path}.gpus", "a CPU service (device: cpu) must not list GPUs")
    extra_args = tuple(
        _extra_arg(a, s.join(f"{path}.extra_args", i))
        for i, a in enumerate(s.string_list(d.get("extra_args", []), f"{path}.extra_args"))
    )
    extra_env = _extra_env(d.get("extra_env"), f"{path}.extra_env")
    port = s.integer(d["port"], f"{path}.port", 1024, 65535)
    ways = parallel(d, len(gpus), engine is Engine.SGLANG, port, path, warnings)
    service = Service(
        name=name,
        host=host,
        gpus=gpus,
        port=port,
        mode=mode,
        engine=engine,
        model=model,
        draft_model=draft,
        ddtree=knobs,
        bind=s.string(d.get("bind", "0.0.0.0"), f"{path}.bind", Kind.ADDRESS),
        served_model_name=s.string(d["served_model_name"], f"{path}.served_model_name", Kind.WORD)
        if d.get("served_model_name")
        else None,
        attention_backend=s.string(d.get("attention_backend", "triton"), f"{path}.attention_backend", Kind.WORD),
        device=device.value,
        dtype=s.choice(d.get("dtype", "auto"), f"{path}.dtype", _Dtype).value,
        api_key=_secret(d["api_key"], f"{path}.api_key") if d.get("api_key") is not None else None,
        extra_args=extra_args,
        extra_env=extra_env,
        health_timeout=s.number(d.get("health_timeout", 600), f"{path}.health_timeout", 1, 7200),
        readiness_delay=s.number(d.get("readiness_delay", 10), f"{path}.readiness_delay", 0, 600),
        tp=ways.tp,
        dp=ways.dp,
        nccl_port=ways.nccl_port,
        smoke_prompt=s.string(d.get("smoke_prompt", SMOKE_PROMPT), f"{path}.smoke_prompt", Kind.PROMPT),
    )
    if service.sglang_wide_tree:
        block = SGLANG_DRAFT_BLOCK
        if knobs.budget > 2 * block - 1 or model.hybrid:
            limit = block - 1 if model.hybrid else 2 * block - 1
            warnings.append(
                f"{path}.ddtree.budget: {knobs.budget} does not fit SGLang's tree worker (budget <= {limit} for "
                f"{block}-token DFlash drafters{' on a hybrid target' if model.hybrid else ''}); the plugin refuses "
                "it at start unless the drafter's block is larger"
            )
        else:
            warnings.append(
                f"{path}.ddtree.budget: {knobs.budget} nodes exceed the drafter's {block}-token block: SGLang verifies "
                "them in a 2 * block window without CUDA graphs (opsctl adds --disable-cuda-graph); compare with a "
                f"budget <= {block - 1} using `opsctl bench --sweep`"
            )
    if service.sglang_hybrid_tree and knobs.allow_hybrid_unsafe:
        warnings.append(
            f"{path}.ddtree.allow_hybrid_unsafe has no effect: sglang's tree verify on a hybrid target is exact"
        )
    sglang_tree_only = (
        ("selfcheck_every", bool(knobs.selfcheck_every), "the self-check is part of SGLang's tree mode"),
        ("round_graphs_max_bs", knobs.round_graphs_max_bs is not None, "it sizes SGLang's tree-mode round graphs"),
    )
    for key, set_here, why in sglang_tree_only:
        if set_here and not service.sglang_tree:
            warnings.append(
                f"{path}.ddtree.{key} has no effect: {why} "
                f"(this service: engine {service.engine.value}, mode {service.mode.value})"
            )
    if knobs.policy.mode is not PolicyMode.OFF and not service.mode.spec.verifies_tree:
        warnings.append(
            f"{path}.ddtree.policy has no effect: it chooses tree mode's round shapes "
            f"(this service: mode {service.mode.value})"
        )
    if service.hybrid_unsafe:
        warnings.append(
            f"{path}: HYBRID UNSAFE: tree verify on hybrid target {model.name} in flat order "
            "(ddtree.allow_hybrid_unsafe); outputs may differ from baseline"
        )
    return service


def _extra_arg(value: Any, path: str) -> str:
    """One extra server argument. Secret flags are refused first, by name only (the value is never shown)."""
    if isinstance(value, str):
        flag = secret_flag(value)
        if flag is not None:
            raise InventoryError(
                path,
                f"{excerpt(flag)}: secrets must not be passed as arguments (SGLang reads prefixes and _ for -)",
                "set the service's api_key: env:NAME or file:PATH",
            )
    return s.string(value, path, Kind.ARG)


def _extra_env(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    d = s.mapping(value, path, set(value) if isinstance(value, dict) else set())
    items: list[tuple[str, str]] = []
    for key, raw in d.items():
        key_path = s.join(path, key)
        s.string(key, key_path, Kind.ENV_NAME)
        if any(hint in key for hint in SECRET_HINTS):
            raise InventoryError(
                key_path,
                "looks like a secret; literal secrets are not allowed",
                "put it in the service's api_key (env:NAME or file:PATH)",
            )
        if key in TEST_HOOK_ENV:
            raise InventoryError(key_path, f"is a benchmark test hook ({TEST_HOOK_ENV[key]})", TEST_HOOK_HINT)
        if key in RESERVED_ENV or key.startswith("DDTREE_"):
            raise InventoryError(key_path, "is set by opsctl itself", "use the matching inventory key instead")
        if key == "SGLANG_PLUGINS" and "ddtree" not in {n.strip() for n in str(raw).split(",")}:
            # SGLang loads only the plugins this lists; without ddtree one request with top_k >= 2**31 ends the
            # server (docs/sglang.md, "A request check SGLang lacks"), whatever the service's mode
            raise InventoryError(key_path, "leaves out the ddtree plugin", "add ddtree to the list, or drop the key")
        if raw == "":
            items.append((key, ""))
            continue
        items.append((key, s.string(raw, key_path, Kind.ENV_VALUE)))
    return tuple(items)


def _check_clashes(services: tuple[Service, ...], gpu_count: int, path: str) -> None:
    ports: dict[int, str] = {}
    gpus: dict[int, str] = {}
    for svc in services:
        where = f"{path}.services.{svc.name}"
        other = ports.setdefault(svc.port, svc.name)
        if other != svc.name:
            raise InventoryError(f"{where}.port", f"{svc.port} already used by {other}")
        for index in svc.gpus:
            if index >= gpu_count:
                raise InventoryError(f"{where}.gpus", f"GPU {index} does not exist (host has {gpu_count} GPUs)")
            owner = gpus.setdefault(index, svc.name)
            if owner != svc.name:
                raise InventoryError(f"{where}.gpus", f"GPU {index} already used by {owner}")
    check_port_clashes(services, path)
