"""Model sync against plain rsync, side by side on the same files and the same lab host (docs/provision.md).

    python dev/model_sync/bench.py -i inventory/lab.yaml --host lab1 [--mib 512] [--shards 4] [--rounds 3]

Makes a model-shaped directory on the control machine (`--shards` random safetensors-sized files and a small
config), then per round, alternating the order: (a) plain `rsync -a` over the same ssh command opsctl uses, into
a fresh /dev/shm directory; (b) opsctl's model_sync step (plan + apply: facts, staging, copy, checksum
verification, swap) into a fresh path. Prints one JSON line per measurement, then the median of the per-round
ratios b/a and the ratio of the totals (less sensitive to one disturbed round on a shared machine).
Both directories are removed afterwards. Needs a running lab (`opsctl lab up`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.inventory.load import load_inventory
from opsctl.inventory.model import ModelSourceKind, ModelSpec
from opsctl.ops.base import Artifacts, Context
from opsctl.ops.model_sync import ModelSync
from opsctl.provision import StepStatus, control_manifest, run_step
from opsctl.remote import connect
from opsctl.remote.rsync import ssh_command


def make_model(root: Path, mib: int, shards: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    per = mib * (1 << 20) // shards
    for i in range(shards):
        with (root / f"model-{i + 1:05d}-of-{shards:05d}.safetensors").open("wb") as fh:
            left = per
            while left:
                chunk = min(left, 8 << 20)
                fh.write(os.urandom(chunk))
                left -= chunk
    (root / "config.json").write_text(json.dumps({"architectures": ["Bench"], "hidden_size": 64}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-i", "--inventory", type=Path, default=Path("inventory/lab.yaml"))
    ap.add_argument("--host", default="lab1")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    inv = load_inventory(args.inventory)
    spec = next(h for h in inv.hosts if h.name == args.host)
    remote = connect(spec)
    with tempfile.TemporaryDirectory(prefix="opsctl-sync-bench-") as tmp:
        source = Path(tmp) / "model"
        make_model(source, args.mib, args.shards)
        t0 = time.monotonic()
        manifest = control_manifest(source)  # hashed once on the control machine (cached by size and mtime)
        print(json.dumps({"what": "control manifest", "s": round(time.monotonic() - t0, 3)}))
        ssh = shlex.join(ssh_command(spec.ssh, remote.known_hosts, remote.key_file, None))
        ratios = []
        totals = [0.0, 0.0]
        for rnd in range(args.rounds):
            plain_dir, sync_dir = f"/dev/shm/bench-plain-{rnd}", f"/dev/shm/bench-sync-{rnd}"
            remote.run(Cmd.of("rm", "-rf", plain_dir, sync_dir))
            model = ModelSpec(str(source), ModelSourceKind.CONTROL, sync_dir, hybrid=False)
            # a service that is not deployed: model_sync would otherwise restart the lab's own unit after the copy
            bench_service = dataclasses.replace(spec.services[0], name="bench-sync", model=model, draft_model=None)
            host = dataclasses.replace(spec, services=(bench_service,))
            ctx = Context(host, remote, artifacts=Artifacts(manifests={str(source): manifest}))

            def plain(d: str = plain_dir) -> float:
                start = time.monotonic()
                remote.run(Cmd.of("mkdir", "-p", d))
                target = f"{spec.ssh.user}@{spec.address}:{d}/"
                subprocess.run(["rsync", "-a", "-e", ssh, f"{source}/", target], check=True)
                took = time.monotonic() - start
                remote.run(Cmd.of("rm", "-rf", d))  # /dev/shm holds one copy at a time
                return took

            def synced(c: Context = ctx, d: str = sync_dir) -> float:
                start = time.monotonic()
                report = run_step(ModelSync(), c, plan_only=False)
                if report.status is not StepStatus.CHANGED:
                    raise SystemExit(f"model_sync: {report.status.value}: {report.error}")
                took = time.monotonic() - start
                remote.run(Cmd.of("rm", "-rf", d))
                return took

            first, second = (plain, synced) if rnd % 2 == 0 else (synced, plain)
            a, b = first(), second()
            t_plain, t_sync = (a, b) if rnd % 2 == 0 else (b, a)
            ratios.append(t_sync / t_plain)
            totals[0] += t_plain
            totals[1] += t_sync
            print(json.dumps({"round": rnd, "mib": args.mib, "plain_rsync_s": round(t_plain, 3),
                              "model_sync_s": round(t_sync, 3), "ratio": round(t_sync / t_plain, 3)}))  # fmt: skip
            remote.run(Cmd.of("rm", "-rf", plain_dir, sync_dir))
    remote.close()
    summary = {
        "median_ratio": round(statistics.median(ratios), 3),
        "total_ratio": round(totals[1] / totals[0], 3),
        "plain_total_s": round(totals[0], 2),
        "sync_total_s": round(totals[1], 2),
        "rounds": args.rounds,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
