"""HTTP to sglang-router's control API and to a worker's load endpoint. The only place opsctl speaks to a router.

sglang-router 0.3.2 (read from the running binary, tests/lab/test_router.py):
- `GET /workers` -> `{"workers": [{"id": UUID, "url": ..., "is_healthy": bool, "load": int, ...}], "total": n}`
- `POST /workers {"url": ...}` -> 202 (queued; the worker shows up once its /health, /server_info and
  /model_info answered)
- `DELETE /workers/<id>` -> 202 (queued)
- `GET /health` 200 once it serves; `GET /readiness` 200 with at least one healthy worker.
With an API key set, everything but /health, /readiness, /liveness and /v1/models needs `Authorization:
Bearer <key>`. httpx errors become RouterError here, once; the key never appears in a message.

A worker's in-flight requests come from its `GET /get_load` (SGLang's shape: a list with one entry per data
parallel rank, `num_reqs` running + `num_waiting_reqs` queued; the reference server answers the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from opsctl.errors import OpsctlError
from opsctl.health import HealthProbe, probe
from opsctl.secrets import SecretRef


class RouterError(OpsctlError):
    pass


@dataclass(frozen=True)
class Member:
    """A worker as the router sees it."""

    id: str
    url: str
    healthy: bool
    load: int  # requests the router has in flight to it


def parse_members(body: Any) -> tuple[Member, ...]:
    """`GET /workers`; anything else is a RouterError naming what was wrong."""
    workers = body.get("workers") if isinstance(body, Mapping) else None
    if not isinstance(workers, list):
        raise RouterError("router answered /workers without a `workers` list")
    out = []
    for item in workers:
        if not isinstance(item, Mapping) or not isinstance(item.get("url"), str) or not isinstance(item.get("id"), str):
            raise RouterError("router answered /workers with an entry lacking id or url")
        load = item.get("load")
        out.append(
            Member(
                id=item["id"],
                url=item["url"].rstrip("/"),
                healthy=item.get("is_healthy") is True,
                load=load if isinstance(load, int) and not isinstance(load, bool) else 0,
            )
        )
    return tuple(out)


def parse_load(body: Any) -> int | None:
    """In-flight requests from a worker's `/get_load` (list per DP rank, or one object); None if unreadable."""
    entries = body if isinstance(body, list) else [body]
    total = 0
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None
        for key in ("num_reqs", "num_waiting_reqs"):
            value = entry.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return None
            total += value
    return total if entries else None


def _one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclass
class RouterClient:
    http: httpx.Client
    base: str  # http://host:port of the router
    api_key: SecretRef | None = None
    timeout: float = 10.0

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key.reveal()}"} if self.api_key is not None else {}

    def _call(self, method: str, path: str, json: Any = None) -> httpx.Response:
        try:
            response = self.http.request(
                method, self.base + path, json=json, headers=self._headers(), timeout=self.timeout
            )
        except httpx.HTTPError as exc:
            raise RouterError(f"router {self.base}: {method} {path}: {_one_line(exc)}") from None
        if response.status_code == 401:
            raise RouterError(f"router {self.base}: {method} {path}: HTTP 401", "check the router's api_key")
        if response.status_code >= 400:
            raise RouterError(
                f"router {self.base}: {method} {path}: HTTP {response.status_code}: {response.text[:200]}"
            )
        return response

    def health(self) -> HealthProbe:
        return probe(self.http, self.base + "/health", timeout=5.0)

    def members(self) -> tuple[Member, ...]:
        response = self._call("GET", "/workers")
        try:
            body = response.json()
        except ValueError:
            raise RouterError(f"router {self.base}: /workers answered no JSON") from None
        return parse_members(body)

    def member(self, url: str) -> Member | None:
        return next((m for m in self.members() if m.url == url.rstrip("/")), None)

    def add(self, url: str) -> None:
        self._call("POST", "/workers", json={"url": url})

    def remove(self, member: Member) -> None:
        self._call("DELETE", f"/workers/{member.id}")


def worker_load(http: httpx.Client, url: str, headers: Mapping[str, str]) -> int | None:
    """In-flight requests of a worker (its /get_load), None when it does not say."""
    try:
        response = http.get(url.rstrip("/") + "/get_load", headers=dict(headers), timeout=5.0)
        if response.status_code != 200:
            return None
        return parse_load(response.json())
    except (httpx.HTTPError, ValueError):
        return None
