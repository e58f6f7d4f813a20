"""The `monitoring:` section: what `opsctl monitor render` puts into the Prometheus rules it renders.

```yaml
monitoring:
  scrape_interval: 15       # seconds between scrapes (and rule evaluations)
  service_down_for: 60      # seconds a target must be down before OpsctlServiceDown fires
  tau_ratio: 0.5            # OpsctlTauDrop: tau of the last 5 minutes below this share of the service's own
  tau_trailing: 86400       #   average over this many seconds (its trailing level) ...
  tau_for: 900              #   ... for this long
  fallback_share: 0.5       # OpsctlTreeMostlyFallback: share of a tree service's decode rounds run by DFLASH
  fallback_for: 900
  ttft_p95: 5.0             # OpsctlTTFTHigh: p95 time to first token over 5 minutes, seconds
  ttft_for: 600
  error_ratio: 0.05         # OpsctlRequestErrors / OpsctlRouterErrors: share of requests aborted (a service) or
  error_for: 300            #   answered 5xx (a router) over the window, for this long
  queue_for: 600            # OpsctlQueueGrowing: a service's queue never empty and growing for this long
  kv_usage: 0.95            # OpsctlKVCacheFull: share of a service's KV cache tokens in use ...
  kv_for: 600               #   ... for this long
  runbook_base_url: https://git.example.com/ops/opsctl/blob/main/docs   # the docs folder: links to
                            #   <base>/runbook.md#<alert's anchor>
```

Every key is optional (the defaults above; no runbook key by default); unknown keys are errors. Values are
checked whole: integers where seconds are counted, numbers in range. The runbook link of every alert is
`runbook_base_url` + `/runbook.md`, or `runbook_url` (the runbook page's own absolute URL, for a copy not named
runbook.md), never both; with neither it is the relative `docs/runbook.md`. Both are absolute http(s) URLs of a
strict character set (no spaces, quotes, braces, `$`, `?` or `#`: they are written into rule annotations, which
Prometheus expands as templates, and each alert adds its own `#anchor`). docs/monitoring.md is the reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from opsctl.errors import InventoryError
from opsctl.inventory import schema as s
from opsctl.inventory.rules import excerpt

DEFAULT_RUNBOOK = "docs/runbook.md"  # relative: only when neither runbook key is set
RUNBOOK_PAGE = "runbook.md"
# scheme, host name (letters, digits, dots, dashes), optional port, optional path of unreserved characters
_URL = re.compile(
    r"https?://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>/[A-Za-z0-9._~/%+@=:,-]{0,400})?"
)
DAY = 86400


@dataclass(frozen=True)
class MonitoringConfig:
    """`monitoring:` (see the module docstring); seconds are whole seconds."""

    scrape_interval: int = 15
    service_down_for: int = 60
    tau_ratio: float = 0.5
    tau_trailing: int = DAY
    tau_for: int = 900
    fallback_share: float = 0.5
    fallback_for: int = 900
    ttft_p95: float = 5.0
    ttft_for: int = 600
    error_ratio: float = 0.05
    error_for: int = 300
    queue_for: int = 600
    kv_usage: float = 0.95
    kv_for: int = 600
    runbook_url: str | None = None  # the runbook page's absolute URL
    runbook_base_url: str | None = None  # the docs folder's absolute URL

    @property
    def runbook(self) -> str:
        """The runbook page every alert links to (each adds its `#anchor`)."""
        if self.runbook_url is not None:
            return self.runbook_url
        if self.runbook_base_url is not None:
            return f"{self.runbook_base_url.rstrip('/')}/{RUNBOOK_PAGE}"
        return DEFAULT_RUNBOOK


# key -> (lo, hi): integers for seconds, numbers for ratios and thresholds
_SECONDS: dict[str, tuple[int, int]] = {
    "scrape_interval": (1, 300),
    "service_down_for": (0, DAY),
    "tau_trailing": (3600, 30 * DAY),
    "tau_for": (0, DAY),
    "fallback_for": (0, DAY),
    "ttft_for": (0, DAY),
    "error_for": (0, DAY),
    "queue_for": (0, DAY),
    "kv_for": (0, DAY),
}
_NUMBERS: dict[str, tuple[float, float]] = {
    "tau_ratio": (0.01, 1.0),
    "fallback_share": (0.0, 1.0),
    "ttft_p95": (0.001, 3600.0),
    "error_ratio": (0.0, 1.0),
    "kv_usage": (0.01, 1.0),
}
KEYS = {f.name for f in fields(MonitoringConfig)}


def parse_monitoring(value: Any, path: str = "monitoring") -> MonitoringConfig:
    d = s.mapping(value, path, KEYS)
    values: dict[str, Any] = {}
    for key, (lo, hi) in _SECONDS.items():
        if key in d:
            values[key] = s.integer(d[key], s.join(path, key), lo, hi)
    for key, (flo, fhi) in _NUMBERS.items():
        if key in d:
            values[key] = s.number(d[key], s.join(path, key), flo, fhi)
    if "runbook_url" in d and "runbook_base_url" in d:
        raise InventoryError(
            s.join(path, "runbook_url"),
            "runbook_url and runbook_base_url are both set",
            "keep one: runbook_base_url (the docs folder; alerts link to <base>/runbook.md) or runbook_url "
            "(the runbook page itself)",
        )
    if "runbook_url" in d:
        values["runbook_url"] = absolute_url(d["runbook_url"], s.join(path, "runbook_url"), "the runbook page")
    if "runbook_base_url" in d:
        where = s.join(path, "runbook_base_url")
        base = values["runbook_base_url"] = absolute_url(d["runbook_base_url"], where, "the docs folder")
        if base.rstrip("/").endswith(".md"):
            raise InventoryError(
                where,
                f"{excerpt(base)} names a page, not the docs folder",
                f"write the folder that holds {RUNBOOK_PAGE}, or set runbook_url to the page instead",
            )
    return MonitoringConfig(**values)


def absolute_url(value: Any, path: str, what: str) -> str:
    """An absolute http(s) URL whose path has only letters, digits and . _ ~ / % + @ = : , - (no query, no
    fragment: opsctl adds each alert's `#anchor`), port 1..65535."""
    if not isinstance(value, str):
        raise InventoryError(path, f"expected a string, got {s.describe(value)}")
    match = _URL.fullmatch(value)
    if match is None or not 1 <= int(match["port"] or 80) <= 65535:
        raise InventoryError(
            path,
            f"{excerpt(value)} is not an absolute http(s) URL",
            f"write the URL of {what}: http(s)://host[:port]/path of letters, digits and . _ ~ / % + @ = : , - "
            "(no ?query or #fragment)",
        )
    return value
