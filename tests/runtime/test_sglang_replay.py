"""ddtree.sglang.replay: the acceptance replay steers the greedy walk along recorded paths (parity with a plain
reference on parent arrays), rebuilds the recorded trees' shapes from flat log-probs, records paths and top-k back
as the same values, and reads its files (ddtree-paths/1 and /2) strictly."""

from __future__ import annotations

import json
import random
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from ddtree.sglang.batch_round import plan_batch
from ddtree.sglang.replay import (
    HOST_CLOCK,
    AcceptanceReplay,
    AcceptRecorder,
    LengthReplay,
    PathRecorder,
    ReplayFormatError,
    impose_topk,
    parse_accepts,
    parse_paths,
    path_ranks,
    recorded_index,
    replay_path_reference,
    replay_rid,
    steer_predictions,
)
from tree_inputs import links

pytestmark = pytest.mark.runtime

VOCAB = 50


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
    first = replay.next_round(["a", "b"], depth=3)
    assert first.ranks == [[0, 0], [0, 0, 0]] and first.topk is None  # b's path cut; v1: no shapes
    assert replay.next_round(["a", "c"], depth=3).ranks == [[1], [0, 0]]  # c: the first recorded request again
    assert replay.next_round(["a"], depth=3).ranks == [[0, 0]]  # a's recording starts again
    replay.finish("a")
    assert replay.next_round(["a"], depth=3).ranks == [[0, 0, 0]]  # a new request under an old id: the next one
    assert (replay.stats.rounds, replay.stats.recorded) == (6, 13)
    replay.check_drafter(15, 8)  # a file without top-k fits any drafter


def test_one_cursor_advance_gives_a_round_its_path_and_its_shape() -> None:
    tables = [[[-0.1 * (r + 1), -2.0]] for r in range(3)]  # round r: one row [-(r + 1) / 10, -2]
    data = {"format": "ddtree-paths/2", "requests": [[{"path": [r], "topk": t} for r, t in enumerate(tables)]]}
    replay = AcceptanceReplay(parse_paths(data))
    got = [replay.next_round(["a", "b"], depth=5) for _ in range(2)]
    assert [g.ranks for g in got] == [[[0], [0]], [[1], [1]]]
    assert got[1].topk is not None and got[1].topk.shape == (2, 1, 2)
    assert torch.allclose(got[1].topk[0], torch.tensor([[-0.2, -2.0]]))  # the same round as the path [1]
    assert replay.next_round(["a"], depth=5).ranks == [[2]]
    with pytest.raises(ReplayFormatError, match=r"recorded top-k tables are 1 x 2, this drafter's are 15 x 8"):
        replay.check_drafter(15, 8)


V2 = "ddtree-paths/2"
TABLE = [[-0.1, -1.0], [-0.5, -0.5]]  # R 2 x k 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"format": "x"}, "not a ddtree-paths/1 or ddtree-paths/2 file"),
        ({"format": V2, "requests": [[[0, 1]]]}, r"requests\[0\]\[0\]: expected \{'path'"),
        ({"format": V2, "requests": [[{"path": [0]}]]}, r"requests\[0\]\[0\]: expected \{'path'"),
        ({"format": V2, "requests": [[{"path": [0], "topk": TABLE, "x": 1}]]}, r"requests\[0\]\[0\]: expected"),
        ({"format": V2, "requests": [[{"path": [-1], "topk": TABLE}]]}, r"requests\[0\]\[0\]\.path: expected a list"),
        ({"format": V2, "requests": [[{"path": [0], "topk": []}]]}, r"\[0\]\.topk: expected a non-empty list"),
        ({"format": V2, "requests": [[{"path": [0], "topk": [[]]}]]}, r"\[0\]\.topk: expected a non-empty list"),
        ({"format": V2, "requests": [[{"path": [], "topk": [[-1.0, -0.1]]}]]}, r"\.topk\[0\]: expected log-probs"),
        ({"format": V2, "requests": [[{"path": [], "topk": [[0.5]]}]]}, r"\.topk\[0\]: expected log-probs <= 0"),
        ({"format": V2, "requests": [[{"path": [], "topk": [[True]]}]]}, r"\.topk\[0\]: expected log-probs"),
        ({"format": V2, "requests": [[{"path": [], "topk": [["a"]]}]]}, r"\.topk\[0\]: expected log-probs"),
        ({"format": V2, "requests": [[{"path": [], "topk": [[float("nan")]]}]]}, r"\.topk\[0\]: expected"),
        ({"format": V2, "requests": [[{"path": [], "topk": [[-1.0], [-1.0, -2.0]]}]]}, r"topk\[1\]: 2 values, row 0"),
        (
            {"format": V2, "requests": [[{"path": [0], "topk": TABLE}], [{"path": [], "topk": [[-1.0, -2.0]]}]]},
            r"requests\[1\]\[0\]\.topk: 1 x 2 values, the file's first round has 2 x 2",
        ),
        ({"format": "ddtree-paths/1", "requests": []}, "requests: expected a non-empty list"),
        ({"format": "ddtree-paths/1", "requests": [[]]}, r"requests\[0\]: expected a non-empty list of rounds"),
        ({"format": "ddtree-paths/1", "requests": [[[0, -1]]]}, r"requests\[0\]\[0\]: expected a list of sibling"),
        ({"format": "ddtree-paths/1", "requests": [[[True]]]}, r"requests\[0\]\[0\]"),
    ],
)
def test_a_bad_paths_file_names_the_place(data: object, message: str) -> None:
    with pytest.raises(ReplayFormatError, match=message):
        parse_paths(data)


def test_a_missing_or_bad_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ReplayFormatError, match="DDTREE_REPLAY_ACCEPTANCE="):
        AcceptanceReplay.from_file(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": V2, "requests": [[{"path": [0]}]]}))
    with pytest.raises(ReplayFormatError, match=r"DDTREE_REPLAY_ACCEPTANCE=.*bad\.json: requests\[0\]\[0\]"):
        AcceptanceReplay.from_file(bad)


def test_a_v2_file_with_infinite_tail_values_parses() -> None:
    # json.loads reads -Infinity (json.dumps writes it for a -inf log-prob): still <= 0 and descending
    data = json.loads(json.dumps({"format": V2, "requests": [[{"path": [0], "topk": [[-0.5, float("-inf")]]}]]}))
    (request,) = parse_paths(data)
    assert request.paths == ((0,),) and request.topk is not None
    assert request.topk.tolist() == [[[-0.5, float("-inf")]]]


def test_recorded_paths_read_back_as_the_replay_of_each_request(tmp_path: Path) -> None:
    out = tmp_path / "paths.json"
    rec = PathRecorder(out, "test run", every=2)
    with pytest.raises(RuntimeError, match="add before draft_topk"):
        rec.add(["r1"], torch.tensor([[0, -1, -1]]))
    rec.draft_topk(torch.tensor([[[-0.123456, -2.0]], [[-0.7, -0.9]]]))  # [bs 2, R 1, k 2]
    rec.add(["r1", "r2"], torch.tensor([[0, 1, -1], [-1, -1, -1]]))
    assert not out.exists()
    rec.draft_topk(torch.tensor([[[-1.0, -3.0]]]))
    rec.add(["r1"], torch.tensor([[2, -1, -1]]))  # the second round writes
    data = json.loads(out.read_text())
    assert data["format"] == "ddtree-paths/2" and data["source"] == "test run"
    assert data["requests"] == [
        [{"path": [0, 1], "topk": [[-0.1235, -2.0]]}, {"path": [2], "topk": [[-1.0, -3.0]]}],  # 4 decimals
        [{"path": [], "topk": [[-0.7, -0.9]]}],
    ]
    replay = AcceptanceReplay.from_file(out)
    assert [r.paths for r in replay.requests] == [((0, 1), (2,)), ((),)]
    rnd = replay.next_round(["x", "y"], 15)
    assert rnd.ranks == [[0, 1], []]
    assert rnd.topk is not None and torch.allclose(rnd.topk, torch.tensor([[[-0.1235, -2.0]], [[-0.7, -0.9]]]))


def accepted_path(parents: list[int], nodes: int, off_spine: bool) -> list[int]:
    """The slots (root first) to the tree's deepest node, or to its deepest node off the spine (a path that
    takes a sibling rank > 0 somewhere)."""

    def root_path(slot: int) -> list[int]:
        out = [slot]
        while parents[out[-1]] >= 0:
            out.append(parents[out[-1]])
        return out[::-1]

    def first_child(slot: int) -> int:
        return min(i for i in range(1, nodes) if parents[i] == slot)

    paths = [root_path(slot) for slot in range(nodes)]
    if off_spine:
        paths = [p for p in paths if any(first_child(a) != b for a, b in pairwise(p))]
    return max(paths, key=len)


def test_a_recorded_shape_replayed_on_flat_logprobs_rebuilds_the_tree_and_the_walk(tmp_path: Path) -> None:
    # the recording: a trained-like drafter (one clear winner per row) gives deep trees; its deepest paths accepted
    bs, rows, vocab, topk, budget, slots = 4, 15, 64, 8, 15, 16
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(bs, rows, vocab, generator=g)
    logits.scatter_add_(-1, torch.randint(vocab, (bs, rows, 1), generator=g), torch.full((bs, rows, 1), 6.0))
    peaked = logits.log_softmax(-1)
    roots, prefixes = torch.arange(bs), torch.full((bs,), 7)
    real = plan_batch(peaked, roots, prefixes, slots, budget, topk)
    nodes = real.num_nodes
    walked = [accepted_path(real.parents[b].tolist(), nodes, off_spine=b % 2 == 1) for b in range(bs)]
    padded = torch.tensor([w + [-1] * (slots - len(w)) for w in walked])
    ranks = path_ranks(real.retrieve_next_token, real.retrieve_next_sibling, padded)
    assert (ranks[1::2] > 0).any(dim=1).all()  # the odd requests' paths leave the spine
    rec = PathRecorder(tmp_path / "paths.json", every=1)
    rec.draft_topk(peaked.topk(topk, dim=-1).values)
    rec.add([f"r{b}" for b in range(bs)], ranks)

    # the replay: a random-weight drafter's flat log-probs, alone a wide and shallow tree
    replay = AcceptanceReplay.from_file(tmp_path / "paths.json")
    replay.check_drafter(rows, topk)
    flat = (torch.randn(bs, rows, vocab, generator=g) * 0.01).log_softmax(-1)
    alone = plan_batch(flat, roots, prefixes, slots, budget, topk)
    assert int(alone.depth.max()) < min(len(w) - 1 for w in walked)  # the recorded paths would be cut short
    rnd = replay.next_round([f"q{b}" for b in range(bs)], depth=rows)
    assert rnd.topk is not None
    ids = flat.topk(topk, dim=-1).indices
    impose_topk(flat, rnd.topk)
    assert torch.equal(flat.topk(topk, dim=-1).indices, ids)  # this round's tokens keep their ranks
    assert torch.isneginf(flat).sum() == bs * rows * (vocab - topk)
    plan = plan_batch(flat, roots, prefixes, slots, budget, topk)
    for name in ("parents", "depths", "retrieve_next_token", "retrieve_next_sibling", "tree_mask"):
        assert torch.equal(getattr(plan, name), getattr(real, name)), name  # the recorded shape
    target = torch.randint(vocab, (bs, slots), generator=g)
    predict, length = steer_predictions(
        plan.tokens, plan.retrieve_next_token, plan.retrieve_next_sibling, target, rnd.ranks, vocab
    )
    assert length.tolist() == [len(w) - 1 for w in walked]  # every recorded path to its full length
    for b in range(bs):
        first, sib = plan.retrieve_next_token[b].tolist(), plan.retrieve_next_sibling[b].tolist()
        assert greedy_walk(plan.tokens[b].tolist(), first, sib, predict[b].tolist()) == walked[b]


def test_replay_ids_name_their_recorded_request_whatever_ran_before() -> None:
    data = {"format": "ddtree-paths/1", "requests": [[[0]], [[1]], [[2]]]}
    replay = AcceptanceReplay(parse_paths(data))
    assert recorded_index(replay_rid(7, "bs4-0-1")) == 7 and recorded_index("replay-x-1") is None
    assert replay.next_round(["warm-a", "warm-b"], depth=3).ranks == [[0], [1]]  # in turn
    # a benchmark level: request i of the level replays recorded request i (mod 3), not the next in turn
    got = replay.next_round([replay_rid(i, "level") for i in range(4)], depth=3).ranks
    assert got == [[0], [1], [2], [0]]
    assert replay.next_round(["warm-c"], depth=3).ranks == [[2]]  # the turn continues where it was


def accepts_file(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "accepts.json"
    path.write_text(json.dumps(data))
    return path


def test_dflash_lengths_record_and_replay_per_request(tmp_path: Path) -> None:
    out = tmp_path / "accepts.json"
    rec = AcceptRecorder(out, "test run", every=2)
    rec.add(["x", "y"], [3, 0])
    assert not out.exists()  # written every 2 rounds
    rec.add(["x"], [15])
    rec.add(["y", "z"], [1, 2])
    rec.write()
    data = json.loads(out.read_text())
    assert data["format"] == "ddtree-accepts/1" and data["source"] == "test run"
    assert parse_accepts(data) == ((3, 15), (0, 1), (2,))
    replay = LengthReplay.from_file(out)
    HOST_CLOCK.take()
    assert replay.next_round([replay_rid(1, "a"), replay_rid(0, "b"), "other"], cap=7) == [0, 3, 3]
    assert replay.next_round([replay_rid(1, "a"), replay_rid(0, "b")], cap=7) == [1, 7]  # capped at the block
    assert replay.next_round([replay_rid(1, "a")], cap=7) == [0]  # past its last round: from the start
    assert (replay.stats.rounds, replay.stats.recorded) == (6, 14)
    assert HOST_CLOCK.take() > 0 and HOST_CLOCK.take() == 0  # the host time, read once


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"format": "ddtree-paths/1", "requests": [[[0]]]}, "not a ddtree-accepts/1 file"),
        ({"format": "ddtree-accepts/1", "requests": []}, "requests: expected a non-empty list"),
        ({"format": "ddtree-accepts/1", "requests": [[]]}, r"requests\[0\]: expected a non-empty list"),
        ({"format": "ddtree-accepts/1", "requests": [[1], [2, -1]]}, r"requests\[1\]: expected .* >= 0"),
        ({"format": "ddtree-accepts/1", "requests": [[True]]}, r"requests\[0\]"),
    ],
)
def test_a_bad_accepts_file_names_the_place(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(ReplayFormatError, match=message):
        parse_accepts(data)
    with pytest.raises(ReplayFormatError, match=f"DDTREE_DFLASH_REPLAY=.*accepts.json: {message}"):
        LengthReplay.from_file(accepts_file(tmp_path, data))
