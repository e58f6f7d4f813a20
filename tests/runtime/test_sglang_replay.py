"""ddtree.sglang.replay: the acceptance replay steers the greedy walk along recorded paths (parity with a plain
reference on parent arrays), records paths back as the same ranks, and reads its file strictly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from ddtree.sglang.replay import (
    AcceptanceReplay,
    PathRecorder,
    ReplayFormatError,
    parse_paths,
    path_ranks,
    replay_path_reference,
    steer_predictions,
)

pytestmark = pytest.mark.runtime

VOCAB = 50


def links(parents: list[int], slots: int) -> tuple[list[int], list[int]]:
    """SGLang's retrieve_next_token / retrieve_next_sibling for a parent array, children in id order."""
    first, sib = [-1] * slots, [-1] * slots
    last: dict[int, int] = {}
    for i in range(1, len(parents)):
        p = parents[i]
        if p in last:
            sib[last[p]] = i
        else:
            first[p] = i
        last[p] = i
    return first, sib


def greedy_walk(tokens: list[int], first: list[int], sib: list[int], predict: list[int]) -> list[int]:
    """verify_tree_greedy's walk: from the root, the child whose token is the target's choice, else stop."""
    path, cur = [0], 0
    while True:
        child = first[cur]
        while child >= 0 and tokens[child] != predict[cur]:
            child = sib[child]
        if child < 0:
            return path
        path.append(child)
        cur = child


def random_tree(rng: random.Random, n: int) -> list[int]:
    parents = [-1]
    for i in range(1, n):
        parents.append(rng.randrange(i))
    return parents


def test_the_walk_follows_the_recorded_ranks_on_every_tree() -> None:
    rng = random.Random(0)
    batch = []
    for _ in range(24):
        n = rng.randrange(1, 12)
        parents = random_tree(rng, n)
        toks = [rng.randrange(VOCAB) for _ in range(n)]
        for i in range(1, n):  # siblings carry distinct tokens, as a tree's top-k rows do
            while any(toks[j] == toks[i] for j in range(1, i) if parents[j] == parents[i]):
                toks[i] = (toks[i] + 1) % VOCAB
        ranks = [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        batch.append((parents, toks, ranks))
    slots, depth = 12, 5
    tok = torch.zeros(len(batch), slots, dtype=torch.int64)
    first = torch.full((len(batch), slots), -1, dtype=torch.int64)
    sib = torch.full_like(first, -1)
    rk = torch.full((len(batch), depth), -1, dtype=torch.int64)
    for b, (parents, toks, ranks) in enumerate(batch):
        f, s = links(parents, slots)
        tok[b, : len(toks)] = torch.tensor(toks)
        first[b], sib[b] = torch.tensor(f), torch.tensor(s)
        rk[b, : len(ranks)] = torch.tensor(ranks, dtype=torch.int64)
    target = torch.randint(0, VOCAB, (len(batch), slots))
    predict, length = steer_predictions(tok, first, sib, target, rk, VOCAB)
    # the worker passes each request's ranks as a plain list (no -1 padding): the same steering
    same, same_length = steer_predictions(tok, first, sib, target, [r for _, _, r in batch], VOCAB)
    assert torch.equal(same, predict) and torch.equal(same_length, length)
    back = path_ranks(first, sib, torch.full((len(batch), depth + 1), -1, dtype=torch.int64))
    assert (back == -1).all()
    walked = []
    for b, (parents, _toks, ranks) in enumerate(batch):
        path = greedy_walk(tok[b].tolist(), first[b].tolist(), sib[b].tolist(), predict[b].tolist())
        assert path == replay_path_reference(parents, ranks), (parents, ranks)
        assert int(length[b]) == len(path) - 1
        walked.append(path + [-1] * (depth + 1 - len(path)))
    # recording the walked paths gives the ranks back (clamped to the children that exist)
    got = path_ranks(first, sib, torch.tensor(walked, dtype=torch.int64))
    for b, (parents, _toks, ranks) in enumerate(batch):
        path = replay_path_reference(parents, ranks)
        want = [sorted(i for i in range(1, len(parents)) if parents[i] == path[d]).index(path[d + 1])
                for d in range(len(path) - 1)]  # fmt: skip
        assert got[b].tolist() == want + [-1] * (depth - len(want))


def test_the_stop_choice_matches_no_child_even_when_the_target_did() -> None:
    # root with children tokens 7, 8, 9; the target's own choice at the root is 7: an empty path must stop there
    tok = torch.tensor([[1, 7, 8, 9]])
    first, sib = links([-1, 0, 0, 0], 4)
    predict, length = steer_predictions(
        tok, torch.tensor([first]), torch.tensor([sib]), torch.tensor([[7, 0, 0, 0]]), torch.tensor([[-1]]), VOCAB
    )
    assert int(predict[0, 0]) not in (7, 8, 9) and int(length[0]) == 0


def test_requests_take_recorded_requests_in_turn_and_wrap(tmp_path: Path) -> None:
    path = tmp_path / "paths.json"
    path.write_text(json.dumps({"format": "ddtree-paths/1", "requests": [[[0, 0], [1]], [[0, 0, 0, 0]]]}))
    replay = AcceptanceReplay.from_file(path)
    assert replay.ranks(["a", "b"], depth=3) == [[0, 0], [0, 0, 0]]  # b's path cut at the depth cap
    assert replay.ranks(["a", "c"], depth=3) == [[1], [0, 0]]  # c: the first recorded request again
    assert replay.ranks(["a"], depth=3) == [[0, 0]]  # a's recording starts again
    replay.finish("a")
    assert replay.ranks(["a"], depth=3) == [[0, 0, 0]]  # a new request under an old id: the next recording
    assert (replay.stats.rounds, replay.stats.recorded) == (6, 13)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"format": "x"}, "not a ddtree-paths/1 file"),
        ({"format": "ddtree-paths/1", "requests": []}, "requests: expected a non-empty list"),
        ({"format": "ddtree-paths/1", "requests": [[]]}, r"requests\[0\]: expected a non-empty list of rounds"),
        ({"format": "ddtree-paths/1", "requests": [[[0, -1]]]}, r"requests\[0\]\[0\]: expected a list of sibling"),
        ({"format": "ddtree-paths/1", "requests": [[[True]]]}, r"requests\[0\]\[0\]"),
    ],
)
def test_a_bad_paths_file_names_the_place(data: object, message: str) -> None:
    with pytest.raises(ReplayFormatError, match=message):
        parse_paths(data)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ReplayFormatError, match="DDTREE_REPLAY_ACCEPTANCE="):
        AcceptanceReplay.from_file(tmp_path / "none.json")


def test_recorded_paths_read_back_as_the_replay_of_each_request(tmp_path: Path) -> None:
    out = tmp_path / "paths.json"
    rec = PathRecorder(out, "test run", every=2)
    rec.add(["r1", "r2"], torch.tensor([[0, 1, -1], [-1, -1, -1]]))
    assert not out.exists()
    rec.add(["r1"], torch.tensor([[2, -1, -1]]))  # the second round writes
    replay = AcceptanceReplay.from_file(out)
    assert replay.source == "test run" and replay.requests == (((0, 1), (2,)), ((),))
    assert replay.ranks(["x", "y"], 15) == [[0, 1], []]
