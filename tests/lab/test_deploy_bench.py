"""Benchmark, not a test (skipped unless OPSCTL_BENCH=1): deploy wall time to 1 vs 4 lab hosts, and opsctl's
own overhead = wall time minus the slowest server's time to become healthy minus the configured readiness
delay. Writes .out/deploy_bench.json; the numbers go to docs/results/deploy-lab.md.

    OPSCTL_BENCH=1 pytest -m lab tests/lab/test_deploy_bench.py -s
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from opsctl.lab import remove_host, status, up
from tests.lab.deploy_support import REPO, derived_inventory, only_hosts, opsctl, provision, tune

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(not os.environ.get("OPSCTL_BENCH"), reason="benchmark: set OPSCTL_BENCH=1"),
]
READINESS = 3.0


def _deploy(inv: Path) -> dict[str, object]:
    start = time.monotonic()
    result = opsctl("deploy", "-i", str(inv), "--mode", "shadow", "--force", "--json")
    wall = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    services = json.loads(result.stdout)["results"]
    healthy = max(float(s["timings"]["healthy_s"]) for s in services)
    return {
        "hosts": len(services),
        "wall_s": round(wall, 2),
        "slowest_healthy_s": round(healthy, 2),
        "readiness_delay_s": READINESS,
        "overhead_s": round(wall - healthy - READINESS, 2),
        "per_service": {f"{s['host']}/{s['service']}": s["timings"] for s in services},
    }


def test_deploy_wall_time_1_vs_4_hosts(lab_config, tmp_path: Path) -> None:
    had = {h.name for h in status(lab_config).hosts}
    up(lab_config, 4)
    try:
        provisioned = provision(always=True)
        assert provisioned.returncode == 0, provisioned.stderr[-3000:]
        runs = {}
        for n in (1, 4):
            names = [f"lab{i}" for i in range(1, n + 1)]

            def mutate(doc, names=names):
                only_hosts(doc, names)
                tune(doc, readiness_delay=READINESS)

            inv = derived_inventory(tmp_path / f"bench{n}.yaml", mutate)
            # the first deploy (new hosts: first release) and a steady-state redeploy (--force)
            runs[n] = [_deploy(inv) for _ in range(2)]
        out = REPO / ".out" / "deploy_bench.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(runs, indent=2))
        print(
            json.dumps({n: [{k: r[k] for k in r if k != "per_service"} for r in v] for n, v in runs.items()}, indent=2)
        )
    finally:
        for name in sorted({h.name for h in status(lab_config).hosts} - had):
            remove_host(lab_config, name)
