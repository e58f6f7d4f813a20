"""A service across several GPUs: tensor parallelism (`tp`), data-parallel replicas (`dp`) and the NCCL
rendezvous port, validated once (docs/inventory.md, "Several GPUs: tp, dp, nccl_port").

SGLang runs `dp` replicas of `tp` ranks each on the service's visible GPUs, so tp * dp must be the number of
GPUs it lists; the one left out defaults from the other (both left out: tp = every GPU, dp = 1). The reference
engine runs on one device.

Rank 0 of a tensor-parallel group binds a TCP rendezvous port (SGLang's `--nccl-port`). Left to SGLang 0.5.23,
it is a random port in 22000-29999 that is free when the server starts (`get_free_port_below_ephemeral`) and is
bound only later by the scheduler, so two services of a host starting together can pick the same one. opsctl
therefore renders an explicit port for a tensor-parallel service, by default `20000 + port % 2000`: below the
range SGLang picks from and below the kernel's ephemeral ports (32768+), so no service's own random choice can
take it. With dp > 1 SGLang needs one port per replica and binds an explicit `--nccl-port` once per replica
(data_parallel_controller.py: the second bind fails), so such a service keeps SGLang's own choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opsctl.errors import InventoryError
from opsctl.inventory import schema as s
from opsctl.inventory.model import Service

MAX_WAYS = 64
NCCL_PORT_BASE = 20000
NCCL_PORT_SPAN = 2000
SGLANG_RANDOM_PORTS = range(22000, 30000)  # where SGLang picks a rendezvous port itself
EPHEMERAL_LOW = 32768  # Linux's default ip_local_port_range starts here


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    dp: int = 1
    nccl_port: int | None = None  # rendered as --nccl-port; None: SGLang picks (tp 1, or dp > 1)


def default_nccl_port(port: int) -> int:
    """The rendezvous port opsctl picks for a tensor-parallel service listening on `port`."""
    return NCCL_PORT_BASE + port % NCCL_PORT_SPAN


def parallel(d: Mapping[str, Any], gpus: int, sglang: bool, port: int, path: str, warnings: list[str]) -> Parallel:
    """tp, dp and nccl_port of one service from its keys `d` (missing keys take their defaults)."""
    tp = s.integer(d["tp"], f"{path}.tp", 1, MAX_WAYS) if d.get("tp") is not None else None
    dp = s.integer(d["dp"], f"{path}.dp", 1, MAX_WAYS) if d.get("dp") is not None else None
    if not sglang:
        for key, value in (("tp", tp), ("dp", dp)):
            if value not in (None, 1):
                raise InventoryError(
                    f"{path}.{key}", f"{value}: the reference engine runs on one device", "use engine: sglang"
                )
        if d.get("nccl_port") is not None:
            raise InventoryError(f"{path}.nccl_port", "only SGLang services across several GPUs use an NCCL port")
        return Parallel()
    tp, dp = _ways(tp, dp, gpus, path)
    nccl = _nccl_port(d.get("nccl_port"), tp, dp, port, path, warnings)
    return Parallel(tp=tp, dp=dp, nccl_port=nccl)


def _ways(tp: int | None, dp: int | None, gpus: int, path: str) -> tuple[int, int]:
    if tp is None and dp is None:
        return max(gpus, 1), 1
    if tp is not None and dp is not None:
        if tp * dp != gpus:
            raise InventoryError(
                f"{path}.tp",
                f"tp {tp} x dp {dp} is {tp * dp} GPUs, but the service lists {gpus}",
                "list tp x dp GPU indexes under gpus",
            )
        return tp, dp
    given, key = (tp, "tp") if tp is not None else (dp, "dp")
    assert given is not None  # one of the two is set here
    if gpus % given:
        raise InventoryError(
            f"{path}.{key}",
            f"{given} does not divide the service's {gpus} GPUs",
            f"list a multiple of {given} GPU indexes under gpus",
        )
    other = gpus // given
    return (given, other) if key == "tp" else (other, given)


def _nccl_port(value: Any, tp: int, dp: int, port: int, path: str, warnings: list[str]) -> int | None:
    if tp == 1 or dp > 1:
        if value is not None:
            why = "SGLang picks one port per data-parallel replica itself" if dp > 1 else "it runs one rank (tp 1)"
            raise InventoryError(f"{path}.nccl_port", f"is only used with tp > 1 and dp 1: {why}")
        return None
    if value is None:
        return default_nccl_port(port)
    nccl = s.integer(value, f"{path}.nccl_port", 1024, 65535)
    if nccl in SGLANG_RANDOM_PORTS or nccl >= EPHEMERAL_LOW:
        where = "SGLang's own NCCL port range, 22000-29999" if nccl in SGLANG_RANDOM_PORTS else "the ephemeral range"
        warnings.append(
            f"{path}.nccl_port: {nccl} is in {where}: another process may take it while this service is down "
            f"(the default, {default_nccl_port(port)}, is not)"
        )
    return nccl


def check_port_clashes(services: Iterable[Service], path: str) -> None:
    """Every HTTP port and NCCL port of a host's services is used once."""
    owners: dict[int, str] = {}
    for svc in services:
        owners.setdefault(svc.port, f"{svc.name}'s port")
    for svc in services:
        if svc.nccl_port is None:
            continue
        other = owners.setdefault(svc.nccl_port, f"{svc.name}'s nccl_port")
        if other != f"{svc.name}'s nccl_port":
            raise InventoryError(
                f"{path}.services.{svc.name}.nccl_port",
                f"{svc.nccl_port} is already used as {other}",
                "set nccl_port to a free port below 22000",
            )
