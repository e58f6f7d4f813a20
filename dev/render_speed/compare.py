"""Inventory load and render speed, this checkout against a base commit (the 1,100-host inventory
renders at least 3x faster with the same error messages). Measures tests/unit/big_inventory.py's inventory
with each tree in turn (runs alternate, so both see the same machine load), medians of CPU seconds, then
checks that both trees refuse a few broken variants of it with the same one-line message.

    python3 dev/render_speed/compare.py [--base 2ad40cc] [--runs 5]

The default base is the commit before the reader's speed work (PyYAML's pure-Python SafeLoader).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE = "2ad40cc"

_MEASURE = """
import sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from big_inventory import big_inventory
from opsctl.inventory.load import load_inventory
from opsctl.render import render_service
path = Path(tempfile.mkdtemp()) / "big.yaml"
path.write_text(big_inventory())
start = time.process_time()
inv = load_inventory(path)
loaded = time.process_time()
for host in inv.hosts:
    for svc in host.services:
        render_service(host, svc, "20260101T000000Z-abc123abc123")
print(loaded - start, time.process_time() - start)
"""

_REFUSE = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, {tests!r})
from big_inventory import big_inventory
from opsctl.errors import OpsctlError
from opsctl.inventory.load import load_inventory
path = Path(tempfile.mkdtemp()) / "big.yaml"
text = big_inventory()
old, new = sys.argv[1], sys.argv[2]
path.write_text(text.replace(old, new, 1))
try:
    load_inventory(path)
    print("accepted")
except OpsctlError as exc:
    print(str(exc).splitlines()[0].replace(str(path), "<file>"))
"""

# (what, text to replace once, replacement): each fault lands in the first host
FAULTS = [
    ("duplicate key", "    gpus: 8\n    services:", "    gpus: 8\n    gpus: 8\n    services:"),
    ("YAML 1.1 octal port", "port: 30001", "port: 030001"),
    ("unknown mode", "mode: baseline", "mode: fastest"),
    ("syntax error", "gpus: [2, 3]", "gpus: [2, 3"),
]


def _tree(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as tmp:
        tmp.write(archive)
        tmp.seek(0)
        with tarfile.open(fileobj=tmp) as tar:
            tar.extractall(into, filter="data")
    return into


def _python(tree: Path, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree}/runtime", "OPSCTL_BIG_KEY": "k"}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    tests = str(REPO / "tests" / "unit")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base " + args.base: _tree(args.base, Path(tmp) / "base"), "this checkout": REPO}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                load, render = _python(tree, _MEASURE.format(tests=tests)).split()
                times[name].append((float(load), float(render)))
        print(f"1,100 hosts, CPU seconds, median of {args.runs} (load average {os.getloadavg()[0]:.1f} at the end)")
        medians = {}
        for name, runs in times.items():
            medians[name] = (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
            print(f"  {name:<16} load {medians[name][0]:.2f} s   load + render all {medians[name][1]:.2f} s")
        base, head = medians.values()
        print(f"  speed-up         load {base[0] / head[0]:.1f}x   load + render all {base[1] / head[1]:.1f}x")
        same = True
        for what, old, new in FAULTS:
            said = [_python(tree, _REFUSE.format(tests=tests), old, new) for tree in trees.values()]
            same &= said[0] == said[1]
            print(f"  {what}: {'same message' if said[0] == said[1] else 'DIFFERENT'}: {said[1]}")
            if said[0] != said[1]:
                print(f"    base said: {said[0]}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
