"""The `routers:` section: sglang-router instances in front of services, validated once into Router objects.

```yaml
routers:
  front:                      # unit opsctl-router-front.service
    host: lab1                # an inventory host
    port: 30080
    services: [lab1/ref, lab2/ref]   # default: every service of the inventory
    policy: round_robin
    api_key: env:ROUTER_KEY
```

docs/inventory.md is the reference; the field comments of `opsctl.inventory.model.Router` say the same.
"""

from __future__ import annotations

from typing import Any

from opsctl.errors import InventoryError
from opsctl.inventory import schema as s
from opsctl.inventory.model import CanaryConfig, Host, Router, RouterPolicy, WorkerRef
from opsctl.inventory.rules import Kind, excerpt
from opsctl.secrets import SecretRef

ROUTER_KEYS = {
    "host",
    "port",
    "bind",
    "services",
    "policy",
    "version",
    "api_key",
    "max_unavailable",
    "drain_timeout",
    "health_timeout",
    "readiness_delay",
    "health_check_interval",
    "metrics_port",
    "canary",
}
CANARY_DEFAULTS = CanaryConfig()
LOOPBACK = ("127.", "::1", "localhost")


def parse_routers(value: Any, hosts: tuple[Host, ...]) -> tuple[Router, ...]:
    data = s.mapping(value, "routers", set(value) if isinstance(value, dict) else set())
    routers = tuple(_router(s.name(key, "routers"), item, hosts, s.join("routers", key)) for key, item in data.items())
    _check_ports(routers, hosts)
    return routers


def _router(name: str, value: Any, hosts: tuple[Host, ...], path: str) -> Router:
    d = s.mapping(value, path, ROUTER_KEYS, {"host", "port"})
    by_name = {h.name: h for h in hosts}
    host = s.name(d["host"], f"{path}.host")
    if host not in by_name:
        raise InventoryError(f"{path}.host", f"no host {excerpt(host)} in this inventory", "name one of `hosts:`")
    if "services" in d:
        workers = tuple(
            _worker(item, by_name, s.join(f"{path}.services", i))
            for i, item in enumerate(s.string_list(d["services"], f"{path}.services"))
        )
    else:
        workers = tuple(WorkerRef(h.name, svc.name) for h in hosts for svc in h.services)
    if not workers:
        raise InventoryError(f"{path}.services", "a router needs at least one service to front")
    twice = next((w for i, w in enumerate(workers) if w in workers[:i]), None)
    if twice is not None:
        raise InventoryError(f"{path}.services", f"{twice} is listed twice", "list each service once")
    for ref in workers:
        svc = by_name[ref.host].service(ref.service)
        if ref.host != host and svc.bind.startswith(LOOPBACK):
            raise InventoryError(
                f"{path}.services",
                f"{ref} listens on {svc.bind} only: the router on {host} cannot reach it",
                f"set hosts.{ref.host}.services.{ref.service}.bind to 0.0.0.0 (or the host's address)",
            )
    api_key = d.get("api_key")
    if api_key is not None and (not isinstance(api_key, str) or not SecretRef.is_reference(api_key)):
        raise InventoryError(
            f"{path}.api_key", "literal secrets are not allowed", "write env:NAME or file:PATH instead"
        )
    keyed = [str(w) for w in workers if by_name[w.host].service(w.service).api_key is not None]
    if keyed and api_key is None:
        raise InventoryError(
            f"{path}.api_key",
            f"{keyed[0]} needs an API key, and the router sends its own key to its workers",
            "set the router's api_key to the services' key (env:NAME or file:PATH)",
        )
    port = s.integer(d["port"], f"{path}.port", 1024, 65535)
    metrics = s.integer(d["metrics_port"], f"{path}.metrics_port", 1024, 65535) if "metrics_port" in d else None
    if metrics is None and port == 65535:
        raise InventoryError(f"{path}.metrics_port", "port + 1 is not a port", "set metrics_port")
    if metrics == port:
        raise InventoryError(f"{path}.metrics_port", f"{port} is the router's own port", "pick another port")
    if any(svc.name == f"router-{name}" for svc in by_name[host].services):
        raise InventoryError(path, f"host {host} has a service named router-{name}: their units would clash")
    return Router(
        name=name,
        host=host,
        port=port,
        workers=workers,
        bind=s.string(d.get("bind", "0.0.0.0"), f"{path}.bind", Kind.ADDRESS),
        policy=s.choice(d.get("policy", RouterPolicy.CACHE_AWARE.value), f"{path}.policy", RouterPolicy),
        version=s.string(d.get("version", Router.version), f"{path}.version", Kind.VERSION),
        api_key=SecretRef(api_key) if api_key is not None else None,
        max_unavailable=s.integer(d.get("max_unavailable", 1), f"{path}.max_unavailable", 1, 1024),
        drain_timeout=s.number(d.get("drain_timeout", Router.drain_timeout), f"{path}.drain_timeout", 0, 3600),
        health_timeout=s.number(d.get("health_timeout", Router.health_timeout), f"{path}.health_timeout", 1, 3600),
        readiness_delay=s.number(d.get("readiness_delay", Router.readiness_delay), f"{path}.readiness_delay", 0, 600),
        health_check_interval=s.integer(d.get("health_check_interval", 2), f"{path}.health_check_interval", 1, 600),
        metrics_port=metrics,
        canary=_canary(d["canary"], len(workers), s.join(path, "canary")) if "canary" in d else None,
    )


def _canary(value: Any, fronted: int, path: str) -> CanaryConfig:
    """Every key checked with its path; `workers` must leave the old release at least one worker."""
    d = s.mapping(value, path, set(CanaryConfig.__dataclass_fields__))
    c = CANARY_DEFAULTS

    def num(key: str, lo: float, hi: float) -> float:
        return s.number(d.get(key, getattr(c, key)), s.join(path, key), lo, hi)

    def count(key: str, lo: int, hi: int) -> int:
        return s.integer(d.get(key, getattr(c, key)), s.join(path, key), lo, hi)

    if fronted < 2:
        raise InventoryError(path, "a canary needs a router with at least 2 workers", "front 2 or more services")
    workers = count("workers", 1, 1024)
    if workers >= fronted:
        raise InventoryError(
            s.join(path, "workers"),
            f"{workers} of the router's {fronted} workers leaves none on the old release to compare with",
            f"at most {fronted - 1}",
        )
    window = num("window", 1, 86400)
    longest = s.number(d.get("max_window", 3 * window), s.join(path, "max_window"), 1, 3 * 86400)
    if longest < window:
        raise InventoryError(
            s.join(path, "max_window"), f"{longest:g} is shorter than window ({window:g})", f"at least {window:g}"
        )
    return CanaryConfig(
        workers=workers,
        window=window,
        max_window=longest,
        min_requests=count("min_requests", 1, 1_000_000),
        max_error_rate=num("max_error_rate", 0, 1),
        max_ttft_ratio=num("max_ttft_ratio", 1, 100),
        max_itl_ratio=num("max_itl_ratio", 1, 100),
        min_tok_s_ratio=num("min_tok_s_ratio", 0, 1),
        min_tau_ratio=num("min_tau_ratio", 0, 1),
        max_selfcheck_failures=count("max_selfcheck_failures", 0, 1_000_000),
        max_restarts=count("max_restarts", 0, 1000),
        replay=count("replay", 0, 100),
    )


def _worker(value: Any, hosts: dict[str, Host], path: str) -> WorkerRef:
    if not isinstance(value, str) or value.count("/") != 1:
        raise InventoryError(path, f"expected HOST/SERVICE, got {excerpt(value)}")
    host_name, service = value.split("/")
    host = hosts.get(s.name(host_name, path))
    if host is None:
        raise InventoryError(path, f"no host {excerpt(host_name)} in this inventory")
    if service not in {svc.name for svc in host.services}:
        raise InventoryError(path, f"host {host.name} has no service {excerpt(s.name(service, path))}")
    return WorkerRef(host.name, service)


def _check_ports(routers: tuple[Router, ...], hosts: tuple[Host, ...]) -> None:
    """A router's ports must be free on its host: no service and no other router there."""
    used: dict[tuple[str, int], str] = {}
    for host in hosts:
        for svc in host.services:
            used[host.name, svc.port] = f"service {svc.name}"
    for router in routers:
        for key, port in (("port", router.port), ("metrics_port", router.prometheus_port)):
            owner = used.setdefault((router.host, port), f"router {router.name}")
            if owner != f"router {router.name}":
                raise InventoryError(f"routers.{router.name}.{key}", f"{port} already used by {owner} on {router.host}")
