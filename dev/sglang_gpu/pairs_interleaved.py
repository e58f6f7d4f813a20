"""The pairs measured to +-5%. Every server is started afresh in every round, alone on the machine
(`--isolation alone`: the others stopped, not idle) or beside the pair's others that all run SGLang's
`--sleep-on-idle` (`--isolation sleep`), measured at every level with `opsctl bench`'s code, and stopped; the
rounds alternate the order (`pairs_stats.interleaved_rounds`), and every ratio is taken within its round.

Run through `bash dev/sglang_gpu/run.sh interleaved ...` (SGLang's wheels, the runtime and the stand-in set up),
like `pairs_bench.py`, whose builds, inventory, rendering and server handling it reuses. One call may run a part
of the rounds (`--rounds 3 --only-round 1`) and write its JSON; `--report A.json B.json ...` merges the calls and
prints, per pair, service and level, the ratio over the reference (median [range], 95% bootstrap interval), or
"wider than +-5%" where the interval is wider (`pairs_stats.LevelVerdict`), and the policy service against the
best fixed service of each round.

Rehearse on a CPU (no SGLang, no server): renders every service and prints the schedule (`--skip-build`: for
the paths the builds would have; without it the pairs are built at `--scale ci --device cpu` first, which needs
the corpus wheels of `python -m ddtree.pairs fetch`):

    PYTHONPATH=$PWD:$PWD/runtime python3 dev/sglang_gpu/pairs_interleaved.py --dry-run --skip-build \\
        --json /tmp/pairs_interleaved.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pairs_bench as bench  # noqa: E402  (beside this file; it puts the repository on sys.path)
from pairs_stats import interleaved_rounds, level_verdict  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", nargs="*", type=Path, help="merge these JSONs and print the verdicts; run nothing")
    p.add_argument("--reference-tau", nargs="*", type=Path, help="print the reference's median greedy tau in these")
    p.add_argument("--default-tau", type=float, default=0.0, help="--reference-tau: printed when none is there")
    p.add_argument("--wheels", type=Path, default=bench.REPO / ".cache" / "pairs" / "wheels")
    p.add_argument("--cache", type=Path, default=Path("/tmp/pairs"))
    p.add_argument("--scale", default="gpu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="build, render, print the schedule; start no server")
    p.add_argument("--skip-build", action="store_true", help="with --dry-run: render for unbuilt pairs' paths")
    p.add_argument("--pairs", default="dense,hybrid")
    p.add_argument("--budgets", type=bench.int_list, default=[7, 15])
    p.add_argument("--policy-budgets", type=bench.int_list, default=[15])
    p.add_argument("--with-baseline", action="store_true", help="the baseline service too (one more start a round)")
    p.add_argument("--isolation", choices=("alone", "sleep"), default="alone")
    p.add_argument(
        "--record",
        type=Path,
        help="instead of the comparison: record rounds for the policy simulator and paths for the acceptance replay "
        "into this directory (one start per shape, greedy; see record_plan)",
    )
    p.add_argument(
        "--record-fair",
        action="store_true",
        help="with --record: the fair replay's recordings instead (fair_record_plan): DFLASH's accepted lengths and "
        "the tree's paths at each --budgets, one start each per --temperatures",
    )
    p.add_argument("--rounds", type=int, default=3, help="server starts per service (>= 3 for a verdict)")
    p.add_argument("--only-round", type=int, default=None, help="run this round only (0-based), e.g. one per call")
    p.add_argument("--concurrency", type=bench.int_list, default=[1, 4, 8, 16, 32])
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=16, help="held-out prompts per level (requests: max(this, 2c))")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--mem-fraction", type=float, default=0.85)
    p.add_argument("--max-total-tokens", type=int, default=131072)
    p.add_argument("--radix-core", default="python")
    p.add_argument("--decode-log-interval", type=int, default=10)
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--start-timeout", type=float, default=180)
    p.add_argument("--level-timeout", type=float, default=60)
    p.add_argument("--deadline", type=float, default=520, help="seconds from start: later starts are skipped")
    p.add_argument("--json", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "pairs_interleaved.json")
    args = p.parse_args(argv)
    # what pairs_bench's service plan and inventory read, fixed here
    args.rg_budgets, args.rg_max_bs, args.rust_probe = [], 0, 0
    return args


def record_plan(pair: str, args: argparse.Namespace) -> list[Any]:
    """The recording services of a pair: the tree with the policy off writing its accepted paths
    (`DDTREE_RECORD_PATHS`, a sync per round: apart from the timed runs); then the largest `--budgets` tree
    pinned to each candidate shape in turn (`ddtree.policy: tree15`, `tree7`, `tree3`, `chain`; pinned, every
    round goes through the policy's bookkeeping), each writing its rounds (`DDTREE_RECORD_ROUNDS`: the configured
    tree's give every shape's acceptance, each shape's its cost)."""
    from ddtree.policy import candidate_shapes

    budget = max(args.budgets)
    # the paths service first: the shape tables need it, and `--deadline` skips the last starts of a round
    env = (("DDTREE_RECORD_PATHS", str(args.record / f"paths-{pair}.json")),)
    specs = [bench.ServiceSpec(f"{pair}-recpaths", pair, "tree", "tree-paths", budget, None, env, (0.0,))]
    for shape in candidate_shapes(budget):
        env = (("DDTREE_RECORD_ROUNDS", str(args.record / f"{pair}-{shape.label}.jsonl")),)
        name = f"{pair}-rec{shape.label}"
        specs.append(bench.ServiceSpec(name, pair, "tree", "tree-record", budget, shape.label, env, (0.0,)))
    return specs


def fair_record_plan(pair: str, args: argparse.Namespace) -> list[Any]:
    """The fair replay's recordings of a pair, per temperature t of `--temperatures`: `linear` (SGLang's DFLASH)
    writing its accepted lengths per request and round (`DDTREE_DFLASH_RECORD`, the stand-in's R1 patch:
    `accepts-<pair>-t<t>.json`, ddtree-accepts/1; t0, t07, t1) and the tree at each `--budgets` writing its
    paths (`DDTREE_RECORD_PATHS`: `paths-<pair>-b<budget>-t<t>.json`), each started alone and driven through the same
    levels and prompts, so the two recordings hold the same requests in the same order."""
    specs = []
    for t in (float(x) for x in args.temperatures.split(",") if x):
        tag = f"t{t:g}".replace(".", "")  # t0, t07, t1: a service name takes no '.'
        env = (("DDTREE_DFLASH_RECORD", str(args.record / f"accepts-{pair}-{tag}.json")),)
        specs.append(bench.ServiceSpec(f"{pair}-recaccepts-{tag}", pair, "linear", "linear", None, None, env, (t,)))
        for budget in args.budgets:
            env = (("DDTREE_RECORD_PATHS", str(args.record / f"paths-{pair}-b{budget}-{tag}.json")),)
            name = f"{pair}-recpaths{budget}-{tag}"
            specs.append(bench.ServiceSpec(name, pair, "tree", "tree-paths", budget, None, env, (t,)))
    return specs


def plan(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per pair: the services (pairs_bench's specs), the reference, and the start order of each round to run."""
    out = {}
    for pair in args.pairs.split(","):
        if args.record is not None:
            specs = fair_record_plan(pair, args) if args.record_fair else record_plan(pair, args)
            out[pair] = {"specs": specs, "reference": "", "rounds": {0: [s.name for s in specs]}}
            continue
        specs = [s for s in bench.service_plan([pair], args) if args.with_baseline or s.mode != "baseline"]
        names = [s.name for s in specs]
        rounds = interleaved_rounds(f"{pair}-linear", names, args.rounds)
        chosen = range(args.rounds) if args.only_round is None else [args.only_round]
        out[pair] = {"specs": specs, "reference": f"{pair}-linear", "rounds": {i: rounds[i] for i in chosen}}
    return out


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def measure(host: Any, svc: Any, spec: Any, args: argparse.Namespace, prompts: list[Any]) -> dict[str, Any]:
    """Every level of one started server, per temperature: tok/s per request of each request, and the summary;
    a recording service also keeps where each level's rounds end in its rounds file (`record_marks`)."""
    from opsctl.bench.load import bench_levels, level_json

    out: dict[str, Any] = {}
    rounds_file = dict(spec.host_env).get("DDTREE_RECORD_ROUNDS")
    marks = [_lines(Path(rounds_file))] if rounds_file else []

    def mark(msg: str) -> None:
        print(msg, flush=True)
        if rounds_file:
            time.sleep(0.5)  # the worker reads its reports two rounds late: the level's last ones arrive idle
            marks.append(_lines(Path(rounds_file)))

    for temp in spec.temperatures:
        levels = bench_levels(
            host, svc, prompts, args.concurrency, 1, args.max_tokens, temp, timeout_s=args.level_timeout, progress=mark
        )
        out[f"t{temp:g}"] = [
            {**level_json(r, len(svc.gpus)), "samples_tok_s": [round(s.tok_s, 2) for s in r.samples]} for r in levels
        ]
    if rounds_file:
        out["record_marks"] = marks
    return out


def write_recordings(result: dict[str, Any], args: argparse.Namespace) -> list[Path]:
    """The recording services' rounds files -> `rounds-<pair>.json` (ddtree-rounds/1, one level per concurrency,
    every shape's run merged into it; docs/policy-rounds.md)."""
    from ddtree.policy import candidate_shapes
    from ddtree.policy_sim import Level, Recording, level_from_reports, recording_json

    shapes = candidate_shapes(max(args.budgets))
    written = []
    for pair in args.pairs.split(","):
        levels: dict[str, Level] = {}
        for rec in result["rounds"]:
            marks = rec.get("levels", {}).get("record_marks")
            if rec["pair"] != pair or not marks:
                continue
            label = rec["service"].removeprefix(f"{pair}-rec")
            lines = (args.record / f"{pair}-{label}.jsonl").read_text().splitlines()
            for c, lo, hi in zip(args.concurrency, marks, marks[1:], strict=False):
                name = f"{pair} c={c}"
                new = level_from_reports(name, pair, shapes, [json.loads(x) for x in lines[lo:hi] if x.strip()])
                old = levels.get(name)
                levels[name] = new if old is None else Level(name, pair, old.rounds + new.rounds)
        if levels:
            source = f"pairs_interleaved.py --record, {time.strftime('%Y-%m-%d')}, {args.scale} build"
            path = args.record / f"rounds-{pair}.json"
            path.write_text(json.dumps(recording_json(Recording(shapes, tuple(levels.values()), source))) + "\n")
            written.append(path)
    return written


def _noop(_pair: str, _build: dict[str, Any]) -> None:
    """pairs_bench.build_pairs' on_ready: here the servers start per round, not as each pair is built."""


def run(args: argparse.Namespace) -> int:
    from opsctl.bench.prompts import BenchPrompt
    from opsctl.inventory.load import load_inventory
    from opsctl.render import render_service

    t0 = time.monotonic()
    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
    log_dir = Path("/tmp/pairs_interleaved_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    schedule = plan(args)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": [], "skipped": []}
    result["schedule"] = {pair: {str(i): order for i, order in p["rounds"].items()} for pair, p in schedule.items()}

    def save(stage: str) -> None:
        result["stage"], result["elapsed_s"] = stage, round(time.monotonic() - t0, 1)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"[{result['elapsed_s']:.0f}s] {stage}", flush=True)

    if args.dry_run and args.skip_build:  # the schedule and the rendering only: where the builds would be
        pairs = {pair: {"dir": str(args.cache / pair), "shm_dir": f"/dev/shm/pairs/{pair}"} for pair in schedule}
    else:
        pairs = bench.build_pairs(args.wheels, args.cache, log_dir, list(schedule), args.scale, args.device, _noop)
    result["builds"] = pairs
    servers: dict[str, Any] = {}
    for pair, p in schedule.items():
        inv = log_dir / f"inventory-{pair}.yaml"
        inv.write_text(bench.inventory_yaml({pair: pairs[pair]}, p["specs"], args))
        host = load_inventory(inv).hosts[0]
        for svc in host.services:
            rendered = render_service(host, svc, "interleaved")
            spec = next(s for s in p["specs"] if s.name == svc.name)
            srv = bench.Server(svc.name, rendered, host.venv, Path("/tmp/pairs_run") / svc.name, log_dir, spec.host_env)
            if args.isolation == "sleep":
                srv.argv.append("--sleep-on-idle")
            servers[svc.name] = (srv, host, svc, spec, f"http://127.0.0.1:{svc.port}")
            result.setdefault("rendered", {})[svc.name] = {"exec_start": srv.argv, "env": srv.rendered_env}
    for pair, p in schedule.items():
        for i, order in p["rounds"].items():
            print(f"{pair} round {i}: {' -> '.join(order)} ({args.isolation})", flush=True)
    save("planned")
    if args.dry_run:
        return 0
    try:
        for pair, p in schedule.items():
            held = json.loads(Path(pairs[pair]["dir"], "heldout.json").read_text())
            prompts = [BenchPrompt(f"h{i}", "heldout", t) for i, t in enumerate(held[-args.prompts :])]
            for i, order in p["rounds"].items():
                group = [servers[name] for name in order]
                if args.isolation == "sleep":  # the pair's servers all up, idle ones asleep
                    bench.start_all([g[0] for g in group])
                    health = bench.wait_healthy([g[0] for g in group], {g[2].name: g[4] for g in group}, 300)
                for srv, host, svc, spec, url in group:
                    if time.monotonic() - t0 > args.deadline:
                        result["skipped"].append(f"{svc.name}@round{i}")
                        continue
                    if args.isolation == "alone":
                        srv.start()
                        health = bench.wait_healthy([srv], {svc.name: url}, args.start_timeout)
                    health = bench.probe([srv], {svc.name: url}, health)
                    rec: dict[str, Any] = {
                        "pair": pair,
                        "round": i,
                        "service": svc.name,
                        "health": health.get(svc.name),
                    }
                    if health[svc.name] == "ok":
                        try:
                            rec["levels"] = measure(host, svc, spec, args, prompts)
                        except Exception as exc:  # one start's failure is its finding; the others still run
                            rec["error"] = f"{type(exc).__name__}: {exc}"[:400]
                    if args.isolation == "alone":
                        srv.stop()
                    result["rounds"].append(rec)
                    save(f"{svc.name} round {i}")
                if args.isolation == "sleep":
                    bench.stop_all([g[0] for g in group])
    finally:
        bench.stop_all([s[0] for s in servers.values()])
        if args.record is not None:
            result["recordings"] = [str(p) for p in write_recordings(result, args)]
        save("done")
    return 0


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """Merged rounds -> report lines: per pair, temperature, service and level, the ratio over the reference, and
    the policy service over the best fixed service of each round."""
    table: dict[tuple[str, str, str, int], dict[int, list[float]]] = {}
    for res in results:
        for rec in res.get("rounds", []):
            for temp, levels in rec.get("levels", {}).items():
                for lv in levels:
                    key = (rec["pair"], temp, rec["service"], int(lv["concurrency"]))
                    table.setdefault(key, {})[int(rec["round"])] = lv["samples_tok_s"]
    lines = ["| pair | temp | service | over | c | verdict |", "|---|---|---|---|---:|---|"]
    for pair, temp, svc, c in sorted(table):
        if svc.endswith("-linear"):
            continue
        refs = [f"{pair}-linear"]
        if "-policy" in svc:
            refs = [s for (p, t, s, cc) in table if (p, t, cc) == (pair, temp, c) and "-policy" not in s]
            refs = sorted(set(refs))
        for ref in refs:
            mine, theirs = table[(pair, temp, svc, c)], table.get((pair, temp, ref, c), {})
            rounds = [(mine[r], theirs[r]) for r in sorted(mine) if r in theirs and mine[r] and theirs[r]]
            if not rounds:
                continue
            v = level_verdict(c, rounds, resamples=1000)
            lines.append(f"| {pair} | {temp} | {svc} | {ref} | {c} | {v.text} |")
        if "-policy" in svc:
            best: list[tuple[list[float], list[float]]] = []  # per round: the policy over that round's best fixed
            for r in sorted(table[(pair, temp, svc, c)]):
                fixed = [f for s in refs if (f := table[(pair, temp, s, c)].get(r))]
                if fixed and table[(pair, temp, svc, c)][r]:
                    top = max(fixed, key=lambda xs: statistics.median(xs))
                    best.append((table[(pair, temp, svc, c)][r], top))
            if best:
                text = level_verdict(c, best, resamples=1000).text
                lines.append(f"| {pair} | {temp} | {svc} | best fixed | {c} | {text} |")
    return lines


def reference_tau(results: list[dict[str, Any]], default: float) -> float:
    """The median greedy tau (opsctl bench's completion tokens / spec_verify_ct) of the reference service's levels
    over these runs: DFLASH's acceptance on the pair, which the shape tables project DFLASH's step with."""
    taus = [
        lv["tau"]
        for res in results
        for rec in res.get("rounds", [])
        if rec["service"].endswith("-linear")
        for lv in rec.get("levels", {}).get("t0", [])
        if lv.get("tau")
    ]
    return statistics.median(taus) if taus else default


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reference_tau is not None:
        print(f"{reference_tau([json.loads(p.read_text()) for p in args.reference_tau], args.default_tau):.3f}")
        return 0
    if args.report is not None:
        print("\n".join(verdicts([json.loads(p.read_text()) for p in args.report])))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
