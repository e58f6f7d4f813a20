"""`--sweep budget=15,32,64`: redeploy one service across DDTree settings through the normal deploy path,
benchmark each, and restore the original release at the end (also on failure or Ctrl-C)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from opsctl.bench.prompts import BenchPrompt
from opsctl.bench.report import Arm
from opsctl.bench.run import BenchSettings, bench_service
from opsctl.errors import OpsctlError
from opsctl.inventory.model import DDTreeKnobs, Host, Service

SWEEP_KNOBS = {"budget": (1, 1024), "topk": (1, 64)}


def parse_sweep(text: str) -> tuple[str, tuple[int, ...]]:
    knob, sep, raw = text.partition("=")
    knob = knob.strip()
    if not sep or knob not in SWEEP_KNOBS:
        raise OpsctlError(f"--sweep {text!r}: expected budget=A,B,... or topk=A,B,...")
    lo, hi = SWEEP_KNOBS[knob]
    try:
        values = tuple(int(v) for v in raw.split(",") if v.strip())
    except ValueError:
        raise OpsctlError(f"--sweep {text!r}: values must be integers") from None
    if not values or any(not lo <= v <= hi for v in values):
        raise OpsctlError(f"--sweep {text!r}: each {knob} must be in {lo}..{hi}")
    return knob, values


def with_knob(service: Service, knob: str, value: int) -> Service:
    base = service.ddtree
    knobs = DDTreeKnobs(
        budget=value if knob == "budget" else base.budget,
        topk=value if knob == "topk" else base.topk,
        allow_hybrid_unsafe=base.allow_hybrid_unsafe,
        log_interval=base.log_interval,
    )
    return dataclasses.replace(service, ddtree=knobs)


def run_sweep(
    host: Host,
    service: Service,
    knob: str,
    values: Sequence[int],
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress: Callable[[str], None],
) -> list[Arm]:
    if not service.mode.ddtree:
        raise OpsctlError(
            f"--sweep {knob} needs a shadow or tree service; {service.name} is {service.mode.value}",
            "pick a DDTREE service",
        )
    from opsctl.rollout.service import current_release, deploy_variant, restore_release

    arms: list[Arm] = []
    original = current_release(host, service)
    try:
        for value in values:
            variant = with_knob(service, knob, value)
            progress(f"sweep: deploying {service.name} with {knob}={value}")
            deploy_variant(host, variant, progress)
            arms.append(bench_service(host, variant, prompts, settings, f"{service.name} {knob}={value}", progress))
    finally:
        progress(f"sweep: restoring {service.name} to release {original}")
        restore_release(host, service, original, progress)
    return arms
