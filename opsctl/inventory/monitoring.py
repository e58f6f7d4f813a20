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
  runbook_url: https://git.example.com/ops/opsctl/blob/main/docs/runbook.md
```

Every key is optional (the defaults above; runbook_url: `docs/runbook.md`); unknown keys are errors. Values are
checked whole: integers where seconds are counted, numbers in range, the URL against a strict character set
(no spaces, quotes, braces or `$`: it is written into rule annotations, which Prometheus expands as templates).
docs/monitoring.md is the reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from opsctl.errors import InventoryError
from opsctl.inventory import schema as s
from opsctl.inventory.rules import excerpt

DEFAULT_RUNBOOK = "docs/runbook.md"
_URL = re.compile(r"(?:https?://[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?)?/?[A-Za-z0-9._~/%+@=:,-]{0,400}")
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
    runbook_url: str = DEFAULT_RUNBOOK


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
    if "runbook_url" in d:
        values["runbook_url"] = runbook_url(d["runbook_url"], s.join(path, "runbook_url"))
    return MonitoringConfig(**values)


def runbook_url(value: Any, path: str) -> str:
    """An http(s) URL or a path, of letters, digits and . _ ~ / % + @ = : , - (no fragment: opsctl adds each
    alert's)."""
    if not isinstance(value, str):
        raise InventoryError(path, f"expected a string, got {s.describe(value)}")
    if not value or not _URL.fullmatch(value):
        raise InventoryError(
            path,
            f"{excerpt(value)} is not a plain URL",
            "write http(s)://host/path or a path: letters, digits and . _ ~ / % + @ = : , - (no #fragment)",
        )
    return value
