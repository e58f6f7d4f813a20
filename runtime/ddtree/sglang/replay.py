"""Acceptance replay: a benchmark hook that makes a random-weight model accept what a real run accepted.

A round's cost at a real model's shape can be measured with random weights, but random weights accept nothing
(tau 1). The replay takes, per request and round, what a real run recorded (a *paths file*, below): the tree's
shape and the accepted path. Before the plan, the drafter's log-probs are rewritten so each row's top-k values
are the recorded ones (`impose_topk`): the planner reads only those values, so it builds the recorded tree's
shape over this round's tokens. After the verify, the target's argmax is steered so the tree walk follows the
recorded path and stops where the recorded walk stopped (`steer_predictions`). The round still does all its
real work (draft, plan, verify, commit, KV and recurrent-state moves); only the drafter's top-k values and the
target's choices come from the recording. Off in production: `DDTREE_REPLAY_ACCEPTANCE=<paths file>`
(`DDTreeConfig.replay_acceptance`), which opsctl refuses to render (an inventory cannot set it:
`ddtree.replay_acceptance` is refused with its reason, every `DDTREE_*` in `extra_env` too).

A path is the sibling rank of each accepted node (0: its parent's first child in the tree links'
`retrieve_next_token` -> `retrieve_next_sibling` order, the order `verify_tree_greedy` tries them). So
`[0, 0, 1]` commits 4 tokens: the spine twice, then the second child. If this round's tree has fewer children
there, the last child is taken; if it ends, the walk stops there (`steer_predictions` returns the steered length,
so the round's statistics show what was committed against `ReplayStats.recorded`). With the recorded shape the
tree holds the recorded path (unless this round's budget is smaller than the recording's, or the 4-decimal
rounding breaks a near-tie of two candidates the other way); without it (a `ddtree-paths/1` file) a random
drafter's flat distributions give a wide, shallow tree that cuts deep paths short.

The paths file, `ddtree-paths/2` (`PathRecorder` writes it, `DDTREE_RECORD_PATHS`):

    {"format": "ddtree-paths/2", "source": "...",
     "requests": [[{"path": [0, 0, 1], "topk": [[-0.0123, -4.5, ...], ...]}, ...], ...]}

one list of rounds per recorded request; per round the accepted path and the drafter's top-k log-probs, one row
of k values (descending, <= 0, 4 decimals) per drafted position (B - 1 rows, k = DDTREE_TOPK; every round of a
file has the same R x k, and the replaying worker checks it against its own at start). `ddtree-paths/1` files
(`"requests": [[[0, 0, 1], [], ...], ...]`, paths only) are still read: their rounds replay the paths in the
tree the drafter builds. A request the replay has not seen takes the next recorded request (round-robin); a
request past its recording's last round starts it again.

Which recorded request a live one replays: a request id of the form `replay-<i>-<anything>` (`replay_rid`, what
dev/sglang_gpu/cost_bench.py gives its requests) replays recorded request `i` (modulo their number), so every
batch size of a benchmark replays the same recorded requests whatever ran before; any other id takes the next
recorded request in turn.

DFLASH's side of the same pair (`ddtree-accepts/1`, `AcceptRecorder` writes it, `LengthReplay` reads it): per
request and round the number of drafted tokens DFLASH's verify accepted,

    {"format": "ddtree-accepts/1", "source": "...", "requests": [[2, 0, 5, 1], [3, 3], ...]}

(tau = the mean of these + 1). The GPU stand-in's DFLASH patch (dev/sglang_gpu/standin/dflash_replay.py) records
and replays it; SGLang's DFLASH worker has no hook of its own for it.

Per round the replay costs the host a few list walks (`AcceptanceReplay.next_round`, `steer_predictions`: the
tree's links come to the host once, a sync the walk after the verify waits for anyway) and the device a handful
of ops (`impose_topk`: a top-k, a fill, one [bs, R, k] host->device copy and a scatter). At TP > 1 the gathered
top-k values are replaced directly (`plan_batch_topk` reads them). `HOST_CLOCK` adds up that host time (the
list walks and launches, not the wait for the verify's results the walk reads), so a benchmark can show it as a
column of its own instead of inside the round it measures.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FORMAT = "ddtree-paths/2"  # what PathRecorder writes
ACCEPTS_FORMAT = "ddtree-accepts/1"  # DFLASH's accepted lengths: AcceptRecorder writes it, LengthReplay reads it
FORMATS = ("ddtree-paths/1", FORMAT)  # what parse_paths reads
DECIMALS = 4  # the recorded log-probs' rounding: ~1 KB a round at 15 x 8


class ReplayFormatError(ValueError):
    """A paths file that does not follow the format (the message names the place)."""


@dataclass(frozen=True, eq=False)
class RecordedRequest:
    """One recorded request's rounds."""

    paths: tuple[tuple[int, ...], ...]  # per round the accepted nodes' sibling ranks
    topk: Tensor | None  # [rounds, R, k] float32: per round the drafter's top-k log-probs; None: ddtree-paths/1


def parse_paths(data: Any) -> tuple[RecordedRequest, ...]:
    """A paths file's JSON, checked: `ddtree-paths/1` (paths only) or `ddtree-paths/2` (paths and top-k)."""
    kind = data.get("format") if isinstance(data, dict) else None
    if kind not in FORMATS:
        raise ReplayFormatError(f"not a {' or '.join(FORMATS)} file (its 'format' key)")
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ReplayFormatError("requests: expected a non-empty list (one list of rounds per request)")
    out = []
    shape: tuple[int, int] | None = None  # the first round's R x k, which every round must have
    for i, rounds in enumerate(requests):
        if not isinstance(rounds, list) or not rounds:
            raise ReplayFormatError(f"requests[{i}]: expected a non-empty list of rounds")
        if kind == FORMATS[0]:
            out.append(RecordedRequest(tuple(_path(p, f"requests[{i}][{j}]") for j, p in enumerate(rounds)), None))
            continue
        paths, tables = [], []
        for j, one in enumerate(rounds):
            where = f"requests[{i}][{j}]"
            if not isinstance(one, dict) or set(one) != {"path", "topk"}:
                raise ReplayFormatError(f"{where}: expected {{'path': [...], 'topk': [[...], ...]}}, got {one!r:.80}")
            paths.append(_path(one["path"], f"{where}.path"))
            table = _topk(one["topk"], f"{where}.topk")
            if shape is None:
                shape = (len(table), len(table[0]))
            elif (len(table), len(table[0])) != shape:
                raise ReplayFormatError(
                    f"{where}.topk: {len(table)} x {len(table[0])} values, the file's first round has "
                    f"{shape[0]} x {shape[1]}"
                )
            tables.append(table)
        out.append(RecordedRequest(tuple(paths), torch.tensor(tables, dtype=torch.float32)))
    return tuple(out)


def _path(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(_rank(r) for r in value):
        raise ReplayFormatError(f"{where}: expected a list of sibling ranks >= 0, got {value!r:.80}")
    return tuple(value)


def _rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _topk(value: Any, where: str) -> list[list[float]]:
    """One round's table: R rows of k log-probs each, descending (NaN fails `<= 0`; -inf passes)."""
    if not isinstance(value, list) or not value or not all(isinstance(row, list) and row for row in value):
        raise ReplayFormatError(f"{where}: expected a non-empty list of non-empty rows, got {value!r:.80}")
    for d, row in enumerate(value):
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) and v <= 0 for v in row)
        if not numbers or any(a < b for a, b in pairwise(row)):
            raise ReplayFormatError(f"{where}[{d}]: expected log-probs <= 0 in descending order, got {row!r:.80}")
        if len(row) != len(value[0]):
            raise ReplayFormatError(f"{where}[{d}]: {len(row)} values, row 0 has {len(value[0])}")
    return value


_RID = re.compile(r"replay-(\d+)-")


def replay_rid(index: int, tag: str) -> str:
    """The request id that makes a replay take recorded request `index` (modulo the recording's size)."""
    return f"replay-{index}-{tag}"


def recorded_index(rid: str) -> int | None:
    """The recorded request a `replay_rid` id names, else None (such a request takes the next one in turn)."""
    match = _RID.match(rid)
    return int(match.group(1)) if match else None


@dataclass
class ReplayClock:
    """Host seconds the replay spent (`add`), read and reset per round by a benchmark's timer (`take`)."""

    seconds: float = 0.0

    def add(self, since: float) -> None:
        self.seconds += time.perf_counter() - since

    def take(self) -> float:
        """Milliseconds since the last take."""
        out, self.seconds = self.seconds * 1e3, 0.0
        return out


HOST_CLOCK = ReplayClock()  # one replay per scheduler process (the tree worker's or the DFLASH patch's)


class _Cursors:
    """Which recorded request and round each live request replays next: `replay-<i>-` ids their recorded request
    `i`, any other the next one in turn; a request past its recording's last round starts it again."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._at: dict[str, tuple[int, int]] = {}  # live request id -> (recorded request, next round)
        self._next = 0

    def advance(self, rid: str) -> tuple[int, int]:
        """(recorded request, its round this request replays now), moving the cursor one round on."""
        if rid not in self._at:
            named = recorded_index(rid)
            if named is None:
                named, self._next = self._next, self._next + 1
            self._at[rid] = (named % self.count, 0)
        which, at = self._at[rid]
        self._at[rid] = (which, at + 1)
        return which, at

    def finish(self, rid: str) -> None:
        self._at.pop(rid, None)


@dataclass
class ReplayStats:
    rounds: int = 0  # request-rounds replayed
    recorded: int = 0  # drafted tokens the recording accepted over them (after the depth cap)


@dataclass(frozen=True, eq=False)
class ReplayRound:
    """One batch round of the recording (`AcceptanceReplay.next_round`): the trees' shapes and the paths."""

    ranks: list[list[int]]  # per request its recorded path's sibling ranks, cut at the depth cap
    topk: Tensor | None  # [bs, R, k] float32 on the host: the recorded top-k log-probs; None: ddtree-paths/1


@dataclass
class AcceptanceReplay:
    """The recorded rounds and, per live request, which recorded request and round comes next."""

    requests: tuple[RecordedRequest, ...]
    source: str = ""
    stats: ReplayStats = field(default_factory=ReplayStats)

    def __post_init__(self) -> None:
        self._cursors = _Cursors(len(self.requests))

    @classmethod
    def from_file(cls, path: str | Path) -> AcceptanceReplay:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ReplayFormatError(f"DDTREE_REPLAY_ACCEPTANCE={path}: {exc}") from None
        try:
            return cls(parse_paths(data), str(data.get("source", "")))
        except ReplayFormatError as exc:
            raise ReplayFormatError(f"DDTREE_REPLAY_ACCEPTANCE={path}: {exc}") from None

    def check_drafter(self, rows: int, topk: int) -> None:
        """Refuse (at the worker's start) recorded top-k tables of another shape than this drafter's
        [rows = B - 1, topk]; a file without tables (ddtree-paths/1) fits any."""
        table = self.requests[0].topk
        if table is not None and tuple(table.shape[1:]) != (rows, topk):
            raise ReplayFormatError(
                f"DDTREE_REPLAY_ACCEPTANCE: the recorded top-k tables are {table.shape[1]} x {table.shape[2]}, this "
                f"drafter's are {rows} x {topk} (block size - 1 x DDTREE_TOPK): replay with the recording's settings"
            )

    def next_round(self, request_ids: Sequence[str], depth: int) -> ReplayRound:
        """This round's recording per request (paths cut to `depth`, the tree's depth cap), advancing each
        request's cursor once; a request not seen before takes the recorded one its id names (`replay_rid`) or the
        next one (`finish` forgets one)."""
        start = time.perf_counter()
        ranks, tables = [], []
        for rid in request_ids:
            which, at = self._cursors.advance(rid)
            recorded = self.requests[which]
            at %= len(recorded.paths)
            path = list(recorded.paths[at][:depth])
            self.stats.rounds += 1
            self.stats.recorded += len(path)
            ranks.append(path)
            if recorded.topk is not None:
                tables.append(recorded.topk[at])
        out = ReplayRound(ranks, torch.stack(tables) if tables else None)
        HOST_CLOCK.add(start)
        return out

    def finish(self, request_id: str) -> None:
        self._cursors.finish(request_id)


def impose_topk(logprobs: Tensor, topk: Tensor) -> None:
    """The drafter's log-probs rewritten in place so each row's top-k values are the recorded ones, at this
    round's top-k tokens (rank for rank); every other token gets -inf, below the recorded k-th value. The
    planner reads only the top-k values, so it builds the recorded tree's shape.

    logprobs: [bs, R, V] (an inference tensor: call it under inference mode); topk: [bs, R, k] descending, on the
    host. One host->device copy and three kernels besides (top-k, fill, scatter): a loop over elements would be
    thousands of launches."""
    start = time.perf_counter()
    ids = logprobs.topk(int(topk.shape[-1]), dim=-1).indices  # [bs, R, k], this round's ranks 0 .. k - 1
    values = topk.to(logprobs.device, dtype=logprobs.dtype, non_blocking=True)
    logprobs.fill_(float("-inf"))
    logprobs.scatter_(-1, ids, values)
    HOST_CLOCK.add(start)


def steer_predictions(
    tokens: Tensor,
    next_token: Tensor,
    next_sibling: Tensor,
    target_predict: Tensor,
    ranks: Tensor | Sequence[Sequence[int]],
    vocab: int,
) -> tuple[Tensor, Tensor]:
    """The target's choices rewritten so the greedy walk follows `ranks` and stops at its end.

    tokens, next_token, next_sibling, target_predict: [bs, S] (the plan's slots and links, -1: none; the target's
    argmax per slot); ranks: per request the sibling ranks of its path (a [bs, D] tensor ends a path at its first
    -1). Along the path each node's choice becomes its chosen child's token; at the path's end (or where the tree
    ends) the choice becomes a token none of that node's children carries (the target's own, moved up past any
    child's), so the walk stops and commits it as the bonus. -> (the new target_predict [bs, S], the steered
    path's length in drafted nodes [bs]).

    The walk runs on the host (one copy of the [bs, S] links each way): as device ops it took D x S small
    kernels, about 2,300 launches and 18-26 ms a round at the 27B shape on an H100, more than the round it
    measures."""
    tok, first, sib, choice = (t.tolist() for t in (tokens, next_token, next_sibling, target_predict))
    start = time.perf_counter()  # after the copies, which wait for the verify (the round's own walk waits too)
    wanted = ranks.tolist() if isinstance(ranks, Tensor) else ranks
    rows: list[int] = []
    cols: list[int] = []
    values: list[int] = []
    lengths: list[int] = []
    for b in range(len(tok)):
        cur, length = 0, 0
        for want in wanted[b]:
            child = first[b][cur]
            if want < 0 or child < 0:
                break
            while want > 0 and sib[b][child] >= 0:  # the want-th sibling, or the last one
                child, want = sib[b][child], want - 1
            rows.append(b)
            cols.append(cur)
            values.append(tok[b][child])
            cur, length = child, length + 1
        children = set()
        child = first[b][cur]
        while child >= 0:
            children.add(tok[b][child])
            child = sib[b][child]
        stop = choice[b][cur]
        while stop in children:  # the stop node: a choice that matches none of its children
            stop = (stop + 1) % vocab
        rows.append(b)
        cols.append(cur)
        values.append(stop)
        lengths.append(length)
    device = target_predict.device
    predict = target_predict.clone()
    index = torch.tensor([rows, cols], dtype=torch.int64).to(device, non_blocking=True)
    predict[index[0], index[1]] = torch.tensor(values, dtype=predict.dtype).to(device, non_blocking=True)
    out = predict, torch.tensor(lengths, dtype=torch.int64).to(device, non_blocking=True)
    HOST_CLOCK.add(start)
    return out


def replay_path_reference(parents: Sequence[int], ranks: Sequence[int]) -> list[int]:
    """The node path (root first) that `steer_predictions` makes the walk take, on a parent array whose children
    are ordered by node id (the reference for parity tests)."""
    path = [0]
    for want in ranks:
        kids = [i for i in range(1, len(parents)) if parents[i] == path[-1]]
        if not kids:
            break
        path.append(kids[min(want, len(kids) - 1)])
    return path


def path_ranks(next_token: Tensor, next_sibling: Tensor, path: Tensor) -> Tensor:
    """The recording side: each accepted node's sibling rank, from the round's tree links and its committed path.

    path: [bs, W] accepted slots, root first, -1 after the end (`BatchCommit.path`). -> [bs, W - 1] ranks, -1
    after the end (the rows of a paths file once moved to the host). No host sync."""
    bs, slots = next_token.shape
    rows = torch.arange(bs, device=path.device)
    out = torch.full((bs, int(path.shape[1]) - 1), -1, dtype=torch.int64, device=path.device)
    for d in range(1, int(path.shape[1])):
        parent, node = path[:, d - 1], path[:, d]
        on = (parent >= 0) & (node >= 0)
        child = next_token[rows, parent.clamp(min=0)]
        rank = torch.zeros(bs, dtype=torch.int64, device=path.device)
        found = child == node
        for _ in range(slots):
            sib = next_sibling[rows, child.clamp(min=0)]
            move = ~found & (child >= 0)
            child = torch.where(move, sib, child)
            rank = rank + move.to(torch.int64)
            found = found | (child == node)
        out[:, d - 1] = torch.where(on & found, rank, out[:, d - 1])
    return out


class PathRecorder:
    """The recording side, in a real pair's run: each request's round, its drafter top-k log-probs (the tree's
    shape, `draft_topk`) and its accepted path (`path_ranks`, `add`), written as a `ddtree-paths/2` file every
    `every` rounds (atomically: a temporary file renamed), requests in order of their first round. `add` reads
    both to the host (a sync per round: use it in a recording run, not a timed one)."""

    def __init__(self, path: str | Path, source: str = "", every: int = 8) -> None:
        # every 8 rounds: a service stopped by a signal loses at most 7 (the last request's tail)
        self.path, self.source, self.every = Path(path), source, every
        self.requests: dict[str, list[dict[str, Any]]] = {}
        self._rounds = 0
        self._topk: Tensor | None = None

    def draft_topk(self, values: Tensor) -> None:
        """This round's top-k log-probs [bs, R, k] (descending), the values its trees were planned from; `add`
        writes them beside the round's paths."""
        self._topk = values

    def add(self, request_ids: Sequence[str], ranks: Tensor) -> None:
        """ranks: [bs, W] from `path_ranks` (-1 after each path), after this round's `draft_topk`."""
        if self._topk is None:
            raise RuntimeError("PathRecorder.add before draft_topk: a round's paths without its trees' top-k")
        tables, self._topk = self._topk.tolist(), None
        for rid, row, table in zip(request_ids, ranks.tolist(), tables, strict=True):
            topk = [[round(v, DECIMALS) for v in values] for values in table]
            self.requests.setdefault(rid, []).append({"path": [r for r in row if r >= 0], "topk": topk})
        self._rounds += 1
        if self._rounds % self.every == 0:
            self.write()

    def write(self) -> None:
        data = {"format": FORMAT, "source": self.source, "requests": list(self.requests.values())}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        tmp.replace(self.path)


# ---------------------------------------------------------------- DFLASH's accepted lengths (ddtree-accepts/1)


def parse_accepts(data: Any) -> tuple[tuple[int, ...], ...]:
    """A `ddtree-accepts/1` file's JSON, checked: per request its rounds' accepted drafted tokens (ints >= 0)."""
    if not isinstance(data, dict) or data.get("format") != ACCEPTS_FORMAT:
        raise ReplayFormatError(f"not a {ACCEPTS_FORMAT} file (its 'format' key)")
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ReplayFormatError("requests: expected a non-empty list (one list of rounds per request)")
    out = []
    for i, rounds in enumerate(requests):
        if not isinstance(rounds, list) or not rounds or not all(_rank(n) for n in rounds):
            raise ReplayFormatError(
                f"requests[{i}]: expected a non-empty list of accepted lengths >= 0, got {rounds!r:.80}"
            )
        out.append(tuple(rounds))
    return tuple(out)


@dataclass
class LengthReplay:
    """DFLASH's recorded accepted lengths and, per live request, which recorded request and round comes next
    (the same assignment as `AcceptanceReplay`)."""

    requests: tuple[tuple[int, ...], ...]
    source: str = ""
    stats: ReplayStats = field(default_factory=ReplayStats)

    def __post_init__(self) -> None:
        self._cursors = _Cursors(len(self.requests))

    @classmethod
    def from_file(cls, path: str | Path, variable: str = "DDTREE_DFLASH_REPLAY") -> LengthReplay:
        try:
            data = json.loads(Path(path).read_text())
            return cls(parse_accepts(data), str(data.get("source", "")))
        except (OSError, json.JSONDecodeError, ReplayFormatError) as exc:
            raise ReplayFormatError(f"{variable}={path}: {exc}") from None

    def next_round(self, request_ids: Sequence[str], cap: int) -> list[int]:
        """This round's accepted length per request, at most `cap` (the block's drafted tokens)."""
        start = time.perf_counter()
        out = []
        for rid in request_ids:
            which, at = self._cursors.advance(rid)
            rounds = self.requests[which]
            n = min(rounds[at % len(rounds)], cap)
            self.stats.rounds += 1
            self.stats.recorded += n
            out.append(n)
        HOST_CLOCK.add(start)
        return out

    def finish(self, request_id: str) -> None:
        self._cursors.finish(request_id)


class AcceptRecorder:
    """The recording side of `ddtree-accepts/1`: each round's accepted lengths per request (`add`), written every
    `every` rounds (atomically), requests in order of their first round."""

    def __init__(self, path: str | Path, source: str = "", every: int = 64) -> None:
        self.path, self.source, self.every = Path(path), source, every
        self.requests: dict[str, list[int]] = {}
        self._rounds = 0

    def add(self, request_ids: Sequence[str], accepted: Sequence[int]) -> None:
        for rid, n in zip(request_ids, accepted, strict=True):
            self.requests.setdefault(rid, []).append(int(n))
        self._rounds += 1
        if self._rounds % self.every == 0:
            self.write()

    def write(self) -> None:
        data = {"format": ACCEPTS_FORMAT, "source": self.source, "requests": list(self.requests.values())}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        tmp.replace(self.path)
