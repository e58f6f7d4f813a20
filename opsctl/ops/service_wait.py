"""service_wait: after provision restarted services (their model was copied anew), wait until each is healthy.

A restarted server loads its model for seconds to minutes; returning earlier lets the next command (a smoke,
a benchmark, a router) meet HTTP 503. The wait is deploy's health gate (opsctl.kernel.gate: unit active,
NRestarts unchanged, /health 200, re-checked after the readiness delay), bounded by the service's
health_timeout, and says how long it has waited through the step's progress line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from opsctl import health, layout, systemd
from opsctl.errors import ProvisionError
from opsctl.inventory.model import Service
from opsctl.kernel.gate import GateConfig, health_gate
from opsctl.ops.base import Context, read

RECHECK_MAX_S = 5.0  # the re-check after the first 200: this model served before, a short one is enough


def wait_healthy(ctx: Context, services: Sequence[Service]) -> list[str]:
    """Notes (`<unit>: healthy after 4.2s`); raises ProvisionError naming the first service that is not."""
    with httpx.Client() as http:
        return [_wait_one(ctx, http, svc) for svc in services]


def _wait_one(ctx: Context, http: httpx.Client, svc: Service) -> str:
    unit = layout.unit_name(svc.name)
    url = health.health_url(ctx.spec, svc)
    started = time.monotonic()

    def read_unit() -> systemd.UnitState:
        return systemd.parse_show(read(ctx.remote, systemd.show_cmd(unit), timeout=60).stdout)

    def probe() -> health.HealthProbe:
        answer = health.probe(http, url, timeout=5.0)
        if ctx.progress is not None:
            waited = time.monotonic() - started
            ctx.progress(f"waiting for {unit}: /health {answer.describe()} ({waited:.0f}s of {svc.health_timeout:g}s)")
        return answer

    config = GateConfig(svc.health_timeout, min(svc.readiness_delay, RECHECK_MAX_S))
    gate = health_gate(read_unit, probe, read_unit().n_restarts, config)
    if not gate.ok:
        raise ProvisionError(
            f"{ctx.spec.name}: {unit} was restarted onto its new model but is not healthy: {gate.reason}",
            f"`opsctl logs -i INVENTORY --host {ctx.spec.name} --service {svc.name}` shows why",
        )
    return f"{unit}: healthy after {gate.time_to_healthy or 0.0:.1f}s"
