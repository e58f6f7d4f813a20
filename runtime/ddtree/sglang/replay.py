"""Acceptance replay: a benchmark hook that makes a random-weight model accept what a real run accepted (issue 45).

A round's cost at a real model's shape can be measured with random weights, but random weights accept nothing
(tau 1). The replay takes, per request and round, the accepted path recorded from a real run (a *paths file*,
`ddtree-paths/1`, below), and steers the target's argmax so the tree walk follows that path in this round's tree
and stops where the recorded walk stopped. The round still does all its real work (draft, plan, verify, commit,
KV and recurrent-state moves); only the target's choices come from the recording. Off in production:
`DDTREE_REPLAY_ACCEPTANCE=<paths file>` (`DDTreeConfig.replay_acceptance`), which opsctl refuses to render
(an inventory cannot set it: `ddtree.replay_acceptance` is refused with its reason, every `DDTREE_*` in
`extra_env` too).

A path is the sibling rank of each accepted node (0: its parent's first child in the tree links'
`retrieve_next_token` -> `retrieve_next_sibling` order, the order `verify_tree_greedy` tries them). So
`[0, 0, 1]` commits 4 tokens: the spine twice, then the second child. If this round's tree has fewer children
there, the last child is taken; if it ends, the walk stops there (`steer_predictions` returns the steered length,
so the round's statistics show what was committed against `ReplayStats.recorded`: a random drafter's trees are
shallower than a trained one's).

The paths file: `{"format": "ddtree-paths/1", "source": "...", "requests": [[[0, 0, 1], [], [0], ...], ...]}`, one
list of rounds per recorded request. A request the replay has not seen takes the next recorded request
(round-robin); a request past its recording's last round starts it again.

`steer_predictions` and `AcceptanceReplay.ranks` are host work on Python lists per round (the tree's links come
to the host once per round: a sync, which the walk after the verify waits for anyway).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FORMAT = "ddtree-paths/1"


class ReplayFormatError(ValueError):
    """A paths file that does not follow the format (the message names the place)."""


def parse_paths(data: Any) -> tuple[tuple[tuple[int, ...], ...], ...]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReplayFormatError(f"not a {FORMAT} file (its 'format' key)")
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ReplayFormatError("requests: expected a non-empty list (one list of rounds per request)")
    out = []
    for i, rounds in enumerate(requests):
        if not isinstance(rounds, list) or not rounds:
            raise ReplayFormatError(f"requests[{i}]: expected a non-empty list of rounds")
        parsed = []
        for j, path in enumerate(rounds):
            ok = isinstance(path, list) and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path)
            if not ok:
                raise ReplayFormatError(f"requests[{i}][{j}]: expected a list of sibling ranks >= 0, got {path!r}")
            parsed.append(tuple(path))
        out.append(tuple(parsed))
    return tuple(out)


@dataclass
class ReplayStats:
    rounds: int = 0  # request-rounds replayed
    recorded: int = 0  # drafted tokens the recording accepted over them (after the depth cap)


@dataclass
class AcceptanceReplay:
    """The recorded paths and, per live request, which recorded request and round comes next."""

    requests: tuple[tuple[tuple[int, ...], ...], ...]
    source: str = ""
    stats: ReplayStats = field(default_factory=ReplayStats)

    def __post_init__(self) -> None:
        self._cursor: dict[str, tuple[int, int]] = {}  # live request id -> (recorded request, next round)
        self._next = 0

    @classmethod
    def from_file(cls, path: str | Path) -> AcceptanceReplay:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ReplayFormatError(f"DDTREE_REPLAY_ACCEPTANCE={path}: {exc}") from None
        return cls(parse_paths(data), str(data.get("source", "")))

    def ranks(self, request_ids: Sequence[str], depth: int) -> list[list[int]]:
        """This round's recorded path per request (truncated to `depth`, the tree's depth cap), advancing each
        request's cursor; a request not seen before takes the next recorded one (`finish` forgets one)."""
        out = []
        for rid in request_ids:
            if rid not in self._cursor:
                self._cursor[rid] = (self._next % len(self.requests), 0)
                self._next += 1
            which, at = self._cursor[rid]
            rounds = self.requests[which]
            path = list(rounds[at % len(rounds)][:depth])
            self._cursor[rid] = (which, at + 1)
            self.stats.rounds += 1
            self.stats.recorded += len(path)
            out.append(path)
        return out

    def finish(self, request_id: str) -> None:
        self._cursor.pop(request_id, None)


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
    return predict, torch.tensor(lengths, dtype=torch.int64).to(device, non_blocking=True)


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
    """The recording side, in a real pair's run: each request's accepted path per round (`path_ranks`), written
    as a paths file every `every` rounds (atomically: a temporary file renamed), requests in order of their first
    round. `add` reads the ranks to the host (a sync per round: use it in a recording run, not a timed one)."""

    def __init__(self, path: str | Path, source: str = "", every: int = 64) -> None:
        self.path, self.source, self.every = Path(path), source, every
        self.requests: dict[str, list[list[int]]] = {}
        self._rounds = 0

    def add(self, request_ids: Sequence[str], ranks: Tensor) -> None:
        """ranks: [bs, W] from `path_ranks` (-1 after each path)."""
        for rid, row in zip(request_ids, ranks.tolist(), strict=True):
            self.requests.setdefault(rid, []).append([r for r in row if r >= 0])
        self._rounds += 1
        if self._rounds % self.every == 0:
            self.write()

    def write(self) -> None:
        data = {"format": FORMAT, "source": self.source, "requests": list(self.requests.values())}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        tmp.replace(self.path)
