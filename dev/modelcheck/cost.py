"""What the model check that deploy makes before any restart costs, side by side on one lab host (docs/deploy.md).

    python dev/modelcheck/cost.py -i inventory/lab.yaml --host lab1 [--service ref] [--rounds 7]

Times `opsctl.facts.modelcheck.check` (one SSH round trip; plus sha256 of the files written since provision verified
them) (a) as the host is, then (b) after rewriting 8 bytes of the first model's largest file in place with the
same bytes (content unchanged, ctime newer than the manifest: that one file is hashed, and the verdict is
CHANGED, not corrupt). Then the host's sha256sum throughput on 512 MiB in /dev/shm, to extrapolate to a real
shard. Prints one JSON line each. (b) leaves the service CHANGED: `opsctl provision --host H` restarts it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time

from opsctl.commands import sh
from opsctl.facts import modelcheck
from opsctl.inventory.load import load_inventory
from opsctl.layout import unit_name
from opsctl.remote import connect
from opsctl.remote.base import Connection


def _median_check(conn: Connection, service: object, unit: str, rounds: int) -> tuple[float, list[str]]:
    times, verdicts = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        verdicts = modelcheck.check(conn, service, unit)  # type: ignore[arg-type]
        times.append(time.perf_counter() - start)
    return statistics.median(times), [str(v.problem) for v in verdicts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--service")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    host = load_inventory(args.inventory).host(args.host)
    service = host.service(args.service) if args.service else host.services[0]
    unit = unit_name(service.name)
    model = modelcheck.model_paths(service)[0]
    with connect(host) as conn:
        median, verdicts = _median_check(conn, service, unit, args.rounds)
        print(json.dumps({"case": "as is", "median_s": round(median, 3), "verdicts": verdicts}))
        q = shlex.quote(model)
        biggest = conn.run(sh(f"find {q} -type f -printf '%s %p\\n' | sort -n | tail -n 1")).stdout.split(" ", 1)
        size, path = int(biggest[0]), shlex.quote(biggest[1].strip())
        rewrite = (
            f"dd if={path} bs=1 skip=4096 count=8 status=none > /tmp/opsctl-8b && "
            f"dd if=/tmp/opsctl-8b of={path} bs=1 seek=4096 conv=notrunc status=none && rm -f /tmp/opsctl-8b"
        )
        conn.run(sh(rewrite, sudo=True))
        median, verdicts = _median_check(conn, service, unit, args.rounds)
        print(json.dumps({"case": f"one file of {size} bytes rewritten in place", "median_s": round(median, 3),
                          "verdicts": verdicts}))  # fmt: skip
        conn.run(sh("head -c 536870912 /dev/urandom > /dev/shm/opsctl-cost.bin", sudo=True))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            conn.run(sh("sha256sum /dev/shm/opsctl-cost.bin > /dev/null"))
            times.append(time.perf_counter() - start)
        conn.run(sh("rm -f /dev/shm/opsctl-cost.bin", sudo=True))
        took = statistics.median(times)
        print(json.dumps({"case": "sha256sum 512 MiB", "median_s": round(took, 2), "mib_s": round(512 / took)}))


if __name__ == "__main__":
    main()
