"""Run the prompt set against each selected service: warm-up, N repeats, then the server's own view
(acceptance length from /metrics, biasing settings from /server_info)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from opsctl.bench.measure import Sample, stream_chat
from opsctl.bench.prompts import BenchPrompt
from opsctl.bench.report import BIAS_KEYS, Arm, parse_prometheus
from opsctl.chat import chat_body, first_model
from opsctl.health import auth_headers, base_url
from opsctl.inventory.model import Host, Inventory, Router, Service
from opsctl.router.render import router_url

ACCEPT_METRIC = "sglang:spec_accept_length"


@dataclass(frozen=True)
class BenchSettings:
    repeat: int = 3
    max_tokens: int = 128
    warmup: int = 1
    timeout_s: float = 600.0


def server_settings(client: httpx.Client, base: str, headers: dict[str, str]) -> dict[str, object]:
    try:
        info = client.get(f"{base}/server_info", headers=headers, timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {key: info[key] for key in BIAS_KEYS if isinstance(info, dict) and key in info}


def accept_length(client: httpx.Client, base: str, headers: dict[str, str]) -> float | None:
    try:
        text = client.get(f"{base}/metrics", headers=headers, timeout=30).text
    except httpx.HTTPError:
        return None
    value = parse_prometheus(text).get(ACCEPT_METRIC)
    return value if value and value > 0 else None


def bench_service(
    host: Host,
    service: Service,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    label: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Arm:
    base = base_url(host, service)
    headers = auth_headers(service.api_key)
    with httpx.Client() as client:
        samples = _measure(client, base, headers, prompts, settings, label or service.name, progress)
        tau = accept_length(client, base, headers) if service.mode.speculative else 1.0
        knobs = service.ddtree if service.mode.ddtree else None
        return Arm(
            label=label or f"{host.name}/{service.name}",
            host=host.name,
            service=service.name,
            mode=service.mode.value,
            engine=service.engine.value,
            settings=server_settings(client, base, headers),
            samples=samples,
            accept_length=tau,
            budget=knobs.budget if knobs else None,
            topk=knobs.topk if knobs else None,
        )


def _measure(
    client: httpx.Client,
    base: str,
    headers: dict[str, str],
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    label: str,
    progress: Callable[[str], None],
) -> tuple[Sample, ...]:
    model = first_model(client, base, headers, 30)
    url = f"{base}/v1/chat/completions"
    for _ in range(settings.warmup):
        body = chat_body(model, prompts[0].prompt, settings.max_tokens, stream=True)
        stream_chat(client, url, body, headers, settings.timeout_s)
    samples: list[Sample] = []
    for repeat in range(settings.repeat):
        for prompt in prompts:
            body = chat_body(model, prompt.prompt, settings.max_tokens, stream=True)
            wall, ttft, tokens, finish = stream_chat(client, url, body, headers, settings.timeout_s)
            samples.append(Sample(prompt.id, repeat, tokens, wall, ttft, finish))
            progress(f"{label}: {prompt.id} #{repeat + 1}: {tokens} tok in {wall:.2f}s")
    return tuple(samples)


def bench_router(
    inventory: Inventory,
    router: Router,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress: Callable[[str], None] = lambda _: None,
) -> Arm:
    """The same measurement through a router (it picks the worker per request). The router has no /server_info
    nor SGLang's accept-length metric: those stay empty; the workers' own arms have them."""
    label = f"router {router.name}"
    with httpx.Client() as client:
        samples = _measure(
            client, router_url(inventory, router), auth_headers(router.api_key), prompts, settings, label, progress
        )
    return Arm(
        label=label,
        host=router.host,
        service=router.unit_base,
        mode="router",
        engine=f"sglang-router {router.version}",
        settings={},
        samples=samples,
        accept_length=None,
    )
