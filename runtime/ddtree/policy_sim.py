"""Replay recorded rounds through the shape policy and compare it with every fixed shape.

The recorded-rounds file (`ddtree-rounds/1`, docs/policy-rounds.md) holds, per level of a run, every round a
service ran: its batch size, its cost, and the tokens each candidate shape committed or would have committed
(`counterfactual_accepts`: exact for the smaller trees, known for all shapes when the largest tree ran). A
level's *replay rounds* are its rounds whose acceptances are known for every shape (a run pinned to the largest
tree gives them); its *cost samples* are every round's (round ms, gap ms) under the shape that ran, per batch
size (runs pinned to each shape give them). The simulation walks the replay rounds in order: a fixed shape commits
its recorded tokens and pays a cost sample of its own at that batch size; the policy decides each round's shape,
pays that shape's sample and hears back, `lag` rounds later, only what that shape's round would have told it
(`counterfactual_accepts`' rule: a tree tells its own and the smaller trees' and the chain's acceptance, the
chain only its own). The cost samples are drawn once per round and shape from a seeded generator, so the fixed
shapes and the policy pay the same draws. Levels of one `series` share one policy, in order (one server start
serving its concurrency levels one after another); each level is scored alone.

The score charges a decision its expected value, not its luck: a round run with shape s counts the level's mean
tokens per request-round of s times the round's batch size, and the mean recorded round + gap ms of s at that
batch size (for a fixed shape these sum to exactly its recorded tokens, and its costs' mean). The recorded
acceptances and the random cost draws reach only the policy's observations. Without this a level's handful of
probe rounds would move its score by more than the 3% the goal allows, whichever way the dice fell.

Pure Python, no torch: `python -m ddtree.policy_sim FILE` prints the table; `python -m ddtree.policy_sim record
...` (docs/policy-rounds.md) turns the worker's recorded rounds into levels.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree.policy import PolicyMode, PolicySetting, Shape, ShapePolicy, stable_config

FORMAT = "ddtree-rounds/1"
GOAL = 0.97  # the policy within 3% of the best fixed shape at every level


class RoundsFormatError(ValueError):
    """A recorded-rounds file that does not follow docs/policy-rounds.md (the message names the place)."""


@dataclass(frozen=True)
class Round:
    """One recorded round. accepted[i]: tokens the batch committed (bonus tokens included) under shapes[i], or
    would have; None where unknown."""

    batch_size: int
    ran: int  # index into the file's shapes
    round_ms: float
    gap_ms: float | None  # to the next decode round's start (None: another forward came between)
    accepted: tuple[int | None, ...]


@dataclass(frozen=True)
class Level:
    name: str
    series: str
    rounds: tuple[Round, ...]
    startup: Mapping[int, Mapping[int, tuple[float, float]]] = field(default_factory=dict)  # bs -> shape i -> ms, sd


@dataclass(frozen=True)
class Recording:
    shapes: tuple[Shape, ...]  # candidates, the configured (largest) tree first
    levels: tuple[Level, ...]
    source: str = ""


# -- the file ---------------------------------------------------------------------------------------------------


def _num(value: Any, where: str, *, least: float = 0.0, integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < least:
        kind = "an integer" if integer else "a number"
        raise RoundsFormatError(f"{where}: expected {kind} >= {least:g}, got {value!r}")
    return value


def parse_recording(data: Any) -> Recording:
    """The JSON value of a recorded-rounds file -> Recording; RoundsFormatError on anything else."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RoundsFormatError(f"not a {FORMAT} file (its 'format' key)")
    try:
        shapes = tuple(Shape.parse(s) for s in data["shapes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RoundsFormatError(f"shapes: expected a list of chain / tree<N> ({exc})") from None
    if not shapes or len(set(shapes)) != len(shapes):
        raise RoundsFormatError("shapes: expected distinct shapes, the configured tree first")
    levels = []
    raw_levels = data.get("levels")
    if not isinstance(raw_levels, list):
        raise RoundsFormatError("levels: expected a list")
    for li, raw in enumerate(raw_levels):
        where = f"levels[{li}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise RoundsFormatError(f"{where}: expected an object with a name")
        rounds = []
        for ri, row in enumerate(raw.get("rounds", [])):
            at = f"{where}.rounds[{ri}]"
            if not isinstance(row, list) or len(row) != 4 + len(shapes):
                raise RoundsFormatError(f"{at}: expected [bs, ran, round_ms, gap_ms, *accepted per shape]")
            bs = _num(row[0], f"{at}[0] (bs)", least=1, integer=True)
            ran = _num(row[1], f"{at}[1] (ran)", integer=True)
            if ran >= len(shapes):
                raise RoundsFormatError(f"{at}[1] (ran): no shape {ran}")
            gap = None if row[3] is None else float(_num(row[3], f"{at}[3] (gap_ms)"))
            acc = tuple(
                None if a is None else _num(a, f"{at}[{4 + i}] (accepted)", least=bs, integer=True)
                for i, a in enumerate(row[4:])
            )
            if acc[ran] is None:
                raise RoundsFormatError(f"{at}: the shape that ran has no acceptance")
            rounds.append(Round(bs, ran, float(_num(row[2], f"{at}[2] (round_ms)", least=1e-6)), gap, acc))
        startup: dict[int, dict[int, tuple[float, float]]] = {}
        for bs_text, per_shape in (raw.get("startup") or {}).items():
            bs = _num(
                int(bs_text) if str(bs_text).isdigit() else -1, f"{where}.startup.{bs_text}", least=1, integer=True
            )
            for label, pair in per_shape.items():
                at = f"{where}.startup.{bs_text}.{label}"
                try:
                    i = shapes.index(Shape.parse(label))
                except ValueError:
                    raise RoundsFormatError(f"{at}: not one of the shapes") from None
                if not isinstance(pair, list) or len(pair) != 2:
                    raise RoundsFormatError(f"{at}: expected [ms, spread_ms]")
                startup.setdefault(bs, {})[i] = (float(_num(pair[0], at, least=1e-6)), float(_num(pair[1], at)))
        levels.append(Level(raw["name"], str(raw.get("series", raw["name"])), tuple(rounds), startup))
    return Recording(shapes, tuple(levels), str(data.get("source", "")))


def recording_json(rec: Recording) -> dict[str, Any]:
    """The file's JSON value (parse_recording's inverse)."""
    levels = []
    for lv in rec.levels:
        rows = [[r.batch_size, r.ran, round(r.round_ms, 4), None if r.gap_ms is None else round(r.gap_ms, 4),
                 *r.accepted] for r in lv.rounds]  # fmt: skip
        item: dict[str, Any] = {"name": lv.name, "series": lv.series}
        if lv.startup:
            item["startup"] = {
                str(bs): {rec.shapes[i].label: [round(ms, 4), round(sd, 4)] for i, (ms, sd) in sorted(per.items())}
                for bs, per in sorted(lv.startup.items())
            }
        item["rounds"] = rows
        levels.append(item)
    return {"format": FORMAT, "source": rec.source, "shapes": [s.label for s in rec.shapes], "levels": levels}


def load_recording(path: Path) -> Recording:
    """A `.json` or gzip-compressed `.json.gz` recorded-rounds file."""
    try:
        raw = path.read_bytes()
        return parse_recording(json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw))
    except json.JSONDecodeError as exc:
        raise RoundsFormatError(f"{path}: not JSON ({exc})") from None


# -- the simulation ---------------------------------------------------------------------------------------------


class CostSamples:
    """Every recorded (round ms, gap ms) per shape and batch size; a batch size without samples of a shape takes
    the nearest recorded one's, scaled by the ratio of batch sizes' costs of the shape that has both (else as is)."""

    def __init__(self, rounds: Sequence[Round], nshapes: int) -> None:
        self.by: list[dict[int, list[tuple[float, float | None]]]] = [{} for _ in range(nshapes)]
        self._means: dict[tuple[int, int], float] = {}
        for r in rounds:
            self.by[r.ran].setdefault(r.batch_size, []).append((r.round_ms, r.gap_ms))

    def has(self, shape: int) -> bool:
        return bool(self.by[shape])

    def mean(self, shape: int, bs: int) -> float:
        """The expected round + gap ms of `shape` at `bs` (what a decision costs, without the draw's luck)."""
        key = (shape, bs)
        if key not in self._means:
            samples, scale = self._near(shape, bs)
            self._means[key] = scale * sum(ms + (gap or 0.0) for ms, gap in samples) / len(samples)
        return self._means[key]

    def _near(self, shape: int, bs: int) -> tuple[list[tuple[float, float | None]], float]:
        table = self.by[shape]
        if bs in table:
            return table[bs], 1.0
        sizes = sorted(table)
        i = bisect.bisect_left(sizes, bs)
        near = min(sizes[max(i - 1, 0) : i + 1], key=lambda s: abs(math.log(s / bs)))
        return table[near], (bs / near if bs > sizes[-1] else 1.0)  # beyond the largest sample: grow with the batch

    def pick(self, shape: int, bs: int, rng: random.Random) -> tuple[float, float | None]:
        """One recorded (round ms, gap ms) of `shape` at `bs`, at random: what the policy measures."""
        samples, scale = self._near(shape, bs)
        ms, gap = samples[rng.randrange(len(samples))]
        return ms * scale, gap


@dataclass(frozen=True)
class LevelResult:
    name: str
    rounds: int
    fixed: dict[Shape, float]  # tokens per ms of each fixed shape over the level's replay rounds
    policy: float  # tokens per ms with the policy
    share: dict[Shape, float]  # fraction of the level's rounds the policy ran each shape
    switches: int  # the policy's switches during the level

    @property
    def best(self) -> Shape:
        return max(self.fixed, key=lambda s: self.fixed[s])

    @property
    def ratio(self) -> float:
        """The policy's tokens per ms over the best fixed shape's."""
        return self.policy / self.fixed[self.best]


def observed(shapes: Sequence[Shape], ran: int, accepted: Sequence[int | None], bs: int) -> dict[Shape, float]:
    """What a round of shapes[ran] tells the policy: per request means, of its own shape and (a tree) of the smaller
    trees and the chain, as `counterfactual_accepts` measures them."""
    me = shapes[ran]
    out = {}
    for s, a in zip(shapes, accepted, strict=True):
        if a is None:
            continue
        if s == me or (not me.is_chain and (s.is_chain or s.budget <= me.budget)):
            out[s] = a / bs
    return out


def simulate(
    rec: Recording,
    make_policy: Callable[[tuple[Shape, ...]], ShapePolicy],
    *,
    lag: int = 2,
    seed: int = 0,
) -> list[LevelResult]:
    """Every level with replay rounds, scored; see the module docstring."""
    shapes = rec.shapes
    results: list[LevelResult] = []
    policies: dict[str, ShapePolicy] = {}
    for level in rec.levels:
        replay = [r for r in level.rounds if all(a is not None for a in r.accepted)]
        costs = CostSamples(level.rounds, len(shapes))
        usable = [i for i in range(len(shapes)) if costs.has(i)]
        if not replay or not usable:
            continue
        if level.series not in policies:
            policies[level.series] = make_policy(tuple(shapes[i] for i in usable))
        policy = policies[level.series]
        for bs, per in level.startup.items():
            for i, (ms, sd) in per.items():
                if shapes[i] in policy.config.shapes:
                    policy.seed_cost(bs, shapes[i], ms, sd)
        rng = random.Random(f"{seed}/{level.series}/{level.name}")
        draws = [{i: costs.pick(i, r.batch_size, rng) for i in usable} for r in replay]
        requests = sum(r.batch_size for r in replay)
        per_request = {i: sum(int(r.accepted[i] or 0) for r in replay) / requests for i in usable}
        fixed = {}
        for i in usable:
            ms = sum(costs.mean(i, r.batch_size) for r in replay)
            fixed[shapes[i]] = per_request[i] * requests / ms
        switches0 = policy.snapshot().switches
        runs: dict[Shape, int] = dict.fromkeys(policy.config.shapes, 0)
        tokens_p, ms_p = 0.0, 0.0
        queue: list[tuple[int, dict[Shape, float], float, float | None]] = []
        for r, d in zip(replay, draws, strict=True):
            dec = policy.decide(r.batch_size)
            i = shapes.index(dec.shape)
            runs[dec.shape] += 1
            tokens_p += per_request[i] * r.batch_size
            round_ms, gap_ms = d[i]
            ms_p += costs.mean(i, r.batch_size)
            queue.append((dec.round_id, observed(shapes, i, r.accepted, r.batch_size), round_ms, gap_ms))
            while len(queue) > lag:
                rid, acc, cost, gap = queue.pop(0)
                policy.observe(rid, accepted=acc, cost_ms=cost, gap_ms=gap)
        share = {s: n / len(replay) for s, n in runs.items()}
        switches = policy.snapshot().switches - switches0
        results.append(LevelResult(level.name, len(replay), fixed, tokens_p / ms_p, share, switches))
    return results


def stable_policy(seed: int = 0) -> Callable[[tuple[Shape, ...]], ShapePolicy]:
    """`auto` as the worker runs it (`stable_config`)."""
    return lambda shapes: ShapePolicy(stable_config(shapes, seed), PolicySetting(PolicyMode.AUTO))


def format_results(results: Sequence[LevelResult], shapes: Sequence[Shape]) -> str:
    head = "| level | rounds | " + " | ".join(f"{s.label} tok/ms" for s in shapes)
    head += " | policy tok/ms | policy / best | best | policy's rounds | switches |"
    lines = [head, "|---" * (len(shapes) + 7) + "|"]
    for r in results:
        cells = [f"{r.fixed[s]:.4f}" if s in r.fixed else "-" for s in shapes]
        mix = ", ".join(f"{s.label} {v:.0%}" for s, v in r.share.items() if v >= 0.005)
        mark = "" if r.ratio >= GOAL else " **below**"
        lines.append(
            f"| {r.name} | {r.rounds} | {' | '.join(cells)} | {r.policy:.4f} | {r.ratio:.3f}{mark} | "
            f"{r.best.label} | {mix} | {r.switches} |"
        )
    return "\n".join(lines)


# -- recording ---------------------------------------------------------------------------------------------------


def level_from_reports(name: str, series: str, shapes: Sequence[Shape], records: Sequence[Mapping[str, Any]]) -> Level:
    """A level from the worker's recorded rounds (`ddtree.sglang.policy_glue.RoundRecorder` lines: round id, batch
    size, the shape that ran, tree_accepted, spine_accepted, smaller, cost_ms, gap_ms); a round without a cost is
    left out."""
    rounds = []
    for rec in records:
        if rec.get("cost_ms") is None or rec.get("tree_accepted") is None:
            continue
        ran = Shape.parse(rec["shape"])
        if ran not in shapes:
            raise RoundsFormatError(f"{name}: round {rec.get('round_id')} ran {ran.label}, not a candidate")
        acc: list[int | None] = [None] * len(shapes)
        acc[shapes.index(ran)] = int(rec["tree_accepted"])
        for i, s in enumerate(shapes):
            if s == ran:
                continue  # what the round committed (a chain round reports it as its spine too)
            if s.is_chain and rec.get("spine_accepted") is not None:
                acc[i] = int(rec["spine_accepted"])
            elif not s.is_chain and str(s.budget) in (rec.get("smaller") or {}):
                acc[i] = int(rec["smaller"][str(s.budget)])
        bs = int(rec["batch_size"])
        gap = rec.get("gap_ms")
        rounds.append(Round(bs, shapes.index(ran), float(rec["cost_ms"]), None if gap is None else float(gap),
                            tuple(acc)))  # fmt: skip
    return Level(name, series, tuple(rounds))


def _cmd_run(args: argparse.Namespace) -> int:
    rec = load_recording(Path(args.file))
    results = simulate(rec, stable_policy(args.seed), lag=args.lag, seed=args.seed)
    print(format_results(results, rec.shapes))
    below = [r.name for r in results if r.ratio < GOAL]
    print(f"\n{len(results) - len(below)} of {len(results)} levels within {1 - GOAL:.0%} of the best fixed shape"
          + (f"; below: {', '.join(below)}" if below else ""))  # fmt: skip
    return 1 if below and args.strict else 0


def _cmd_record(args: argparse.Namespace) -> int:
    shapes = tuple(Shape.parse(s) for s in args.shapes.split(","))
    out = Path(args.out)
    rec = load_recording(out) if out.exists() else Recording(shapes, ())
    if rec.shapes != shapes:
        raise RoundsFormatError(f"{out}: its shapes are {[s.label for s in rec.shapes]}, not {args.shapes}")
    levels = list(rec.levels)
    for path in args.records:
        lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        new = level_from_reports(args.level, args.series or args.level, shapes, lines)
        merged = next((i for i, lv in enumerate(levels) if lv.name == new.name), None)
        if merged is None:
            levels.append(new)
        else:
            old = levels[merged]
            levels[merged] = Level(old.name, old.series, old.rounds + new.rounds, old.startup)
    out.write_text(json.dumps(recording_json(Recording(shapes, tuple(levels), args.source or rec.source))) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree.policy_sim", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="replay a recorded-rounds file through the policy")
    run.add_argument("file")
    run.add_argument("--lag", type=int, default=2, help="rounds before a round's report reaches the policy")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--strict", action="store_true", help="exit 1 if a level is below the goal")
    rec = sub.add_parser("record", help="add a worker's recorded rounds (JSON lines) to a file as one level")
    rec.add_argument("records", nargs="+", help="DDTREE_RECORD_ROUNDS files")
    rec.add_argument("--out", required=True)
    rec.add_argument("--level", required=True, help="e.g. 'hybrid c=4'; rounds of one level name are merged")
    rec.add_argument("--series", default="", help="levels served by one server start, in order (default: level)")
    rec.add_argument("--shapes", required=True, help="the candidates, configured first: tree15,tree7,tree3,chain")
    rec.add_argument("--source", default="", help="machine, date, command")
    args = ap.parse_args(argv)
    try:
        return _cmd_run(args) if args.cmd == "run" else _cmd_record(args)
    except (RoundsFormatError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
