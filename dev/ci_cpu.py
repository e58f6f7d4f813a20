"""Where a CI run's CPU goes, process by process (docs/ci.md, "Reading a run's times").

    python3 dev/ci_cpu.py sample OUT.json &    # every 2 s: every process's CPU time, command line and parent
    bash .ci/run; touch OUT.json.stop          # the sampler writes OUT.json and exits
    python3 dev/ci_cpu.py report OUT.json      # CPU seconds per command (and per subtree with --under REGEX)
    python3 dev/ci_cpu.py timeline OUT.json    # the machine's busy and I/O-wait share, minute by minute

scripts/check prints each tier's CPU seconds (a cpuacct cgroup per tier); this says which processes inside a tier
used them. A process that lives less than one period is missed (short CLIs, ssh): compare the total with the
machine's busy CPU-seconds that scripts/check prints at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
Row = tuple[int, int, float, str, int]  # pid, start tick, CPU seconds, command line, parent pid


def _read(pid: str) -> Row | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError):
        return None  # gone between listing and reading
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime, all threads
    return int(pid), int(fields[19]), cpu, cmd[:300] or f"[{comm}]", int(fields[1])


def _machine_ticks() -> tuple[int, int]:
    """(busy, iowait) clock ticks of all CPUs so far, from /proc/stat's first line. Busy is what scripts/check's
    busy_jiffies counts: user, nice, system, irq, softirq and steal (guest time is inside user already)."""
    user, nice, system, _idle, iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return user + nice + system + irq + softirq + steal, iowait


def sample(out: Path, period: float) -> None:
    seen: dict[tuple[int, int], Row] = {}
    stop = out.with_name(out.name + ".stop")
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.clear())
    began = time.monotonic()
    timeline: list[tuple[float, int, int]] = []  # (seconds since the start, busy ticks, iowait ticks)
    while running and not stop.exists():
        timeline.append((round(time.monotonic() - began, 1), *_machine_ticks()))
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if (row := _read(pid)) is not None:
                known = seen.get((row[0], row[1]))
                if known is not None and row[3].startswith("[") and not known[3].startswith("["):
                    row = (*row[:3], known[3], row[4])  # an exiting process (a zombie) has no command line left
                seen[(row[0], row[1])] = row
        time.sleep(period)
    out.write_text(json.dumps(list(seen.values())))
    out.with_name(out.name + ".timeline").write_text(json.dumps(timeline))


def timeline(path: Path, window: float) -> None:
    """Per window: how much of the machine's CPUs was busy and how much waited on I/O (an idle core with a
    process blocked on the disk), from the samples `sample` took."""
    points = json.loads(path.with_name(path.name + ".timeline").read_text())
    cpus = os.cpu_count() or 1
    start = 0
    for end in range(1, len(points)):
        if points[end][0] - points[start][0] >= window or end == len(points) - 1:
            span = (points[end][0] - points[start][0]) * TICK * cpus
            busy = (points[end][1] - points[start][1]) / span
            iowait = (points[end][2] - points[start][2]) / span
            print(f"{points[start][0]:7.0f}-{points[end][0]:<7.0f} busy {busy:4.0%}  iowait {iowait:4.0%}")
            start = end


def report(path: Path, under: str | None, top: int) -> None:
    rows: list[Row] = [(int(p), int(t), float(c), str(m), int(pp)) for p, t, c, m, pp in json.loads(path.read_text())]
    children: dict[int, list[Row]] = collections.defaultdict(list)
    for row in rows:
        children[row[4]].append(row)
    chosen = rows
    if under is not None:
        picked: dict[tuple[int, int], Row] = {}
        todo = [r for r in rows if re.search(under, r[3])]
        while todo:
            row = todo.pop()
            if (row[0], row[1]) not in picked:
                picked[(row[0], row[1])] = row
                todo += [c for c in children[row[0]] if c[1] >= row[1]]  # started after it: not a reused pid's
        chosen = list(picked.values())
    per: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for row in chosen:
        cpu, cmd = row[2], row[3]
        kind = re.sub(r"\d+", "#", re.sub(r"/releases/\S+|/tmp/\S+", "X", cmd))[:120]
        per[kind] += cpu
        count[kind] += 1
    print(f"{sum(per.values()):.0f} CPU-seconds in {len(chosen)} processes")
    for kind, used in sorted(per.items(), key=lambda item: -item[1])[:top]:
        print(f"{used:8.1f} {count[kind]:5d}  {kind}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("--period", type=float, default=2.0)
    r = sub.add_parser("report")
    r.add_argument("path", type=Path)
    r.add_argument("--under", help="only the processes whose command matches REGEX, and their descendants")
    r.add_argument("--top", type=int, default=40)
    t = sub.add_parser("timeline")
    t.add_argument("path", type=Path)
    t.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    if args.verb == "sample":
        sample(args.out, args.period)
    elif args.verb == "timeline":
        timeline(args.path, args.window)
    else:
        report(args.path, args.under, args.top)


if __name__ == "__main__":
    main()
