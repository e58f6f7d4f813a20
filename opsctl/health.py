"""HTTP health probes (and a /metrics scrape) against a service's OpenAI-compatible server, and the pure gate
logic around them.

The only place opsctl's deploy path speaks HTTP to a service (smoke.py has the request side). httpx errors are
translated here once into a `HealthProbe` value, never raised to the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from opsctl import promtext
from opsctl.inventory.model import Host, Service
from opsctl.secrets import SecretRef


def base_url(host: Host, service: Service) -> str:
    """Where the control machine reaches a service: the host's address and the service's port."""
    address = host.address
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"  # IPv6 literal
    return f"http://{address}:{service.port}"


def auth_headers(api_key: SecretRef | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key.reveal()}"} if api_key is not None else {}


@dataclass(frozen=True)
class HealthProbe:
    ok: bool  # HTTP 200
    status_code: int | None  # None: no HTTP answer at all
    error: str | None  # connection refused, timeout, ... (one line)
    latency_s: float

    def describe(self) -> str:
        if self.ok:
            return f"HTTP 200 in {self.latency_s * 1000:.0f} ms"
        if self.status_code is not None:
            return f"HTTP {self.status_code}"
        return self.error or "no answer"


def probe(client: httpx.Client, url: str, timeout: float = 5.0) -> HealthProbe:
    """GET `url` (normally <base>/health) once."""
    start = time.monotonic()
    try:
        response = client.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return HealthProbe(False, None, f"timed out after {timeout:g}s", time.monotonic() - start)
    except httpx.HTTPError as exc:
        return HealthProbe(False, None, _one_line(exc), time.monotonic() - start)
    return HealthProbe(response.status_code == 200, response.status_code, None, time.monotonic() - start)


def _one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    reason = text[-1] if text else ""
    name = type(exc).__name__
    if "Connection refused" in reason or "ConnectError" in name:
        return "connection refused" if "refused" in reason.lower() else f"cannot connect: {reason or name}"
    return f"{name}: {reason}" if reason else name


def health_url(host: Host, service: Service) -> str:
    return base_url(host, service) + "/health"


def metrics_url(host: Host, service: Service) -> str:
    """The service's Prometheus metrics (SGLang's with --enable-metrics, the reference server's): no API key."""
    return base_url(host, service) + "/metrics"


def scrape(client: httpx.Client, url: str, timeout: float = 5.0) -> promtext.Scrape:
    """GET `url` (a service's /metrics) once; no answer or not 200 is a Scrape with `error` and no samples."""
    try:
        response = client.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return promtext.Scrape({}, error=f"timed out after {timeout:g}s")
    except httpx.HTTPError as exc:
        return promtext.Scrape({}, error=_one_line(exc))
    if response.status_code != 200:
        return promtext.Scrape({}, error=f"HTTP {response.status_code}")
    return promtext.parse(response.text)
