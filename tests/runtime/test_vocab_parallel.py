"""The drafter's top-k from a vocab-parallel LM head (ddtree.sglang.vocab_parallel): the sharded top-k
equals the unsharded one in values, ids and order, ties across shard boundaries included; every rank gets the
same; and the same path on real torch.distributed processes (gloo, CPU) plans the same trees as TP 1."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ddtree.batch_tree import batch_row_topk, build_trees_batched, build_trees_from_topk
from ddtree.config import DDTreeConfig
from ddtree.modes import Mode
from ddtree.sglang.shadow import observe_draft, observe_draft_sharded
from ddtree.sglang.vocab_parallel import Gather, HeadShard, merge_topk, shard_logprobs, shard_topk
from ddtree.tree import row_topk
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Lockstep:
    """`Gather` for n ranks simulated by n threads: each call returns every rank's tensor, in rank order."""

    def __init__(self, ranks: int) -> None:
        self.barrier = threading.Barrier(ranks, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * ranks

    def gather_for(self, rank: int) -> Gather:
        def gather(local: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = local.clone()
            self.barrier.wait()
            out = torch.stack([t for t in self.slots if t is not None])
            self.barrier.wait()  # every rank has read before the next call overwrites
            return out

        return gather


def on_ranks(ranks: int, fn: Callable[[int, Gather], Any]) -> list[Any]:
    """fn(rank, gather) on `ranks` threads in lockstep; the results in rank order."""
    lock, results, errors = Lockstep(ranks), [None] * ranks, []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank, lock.gather_for(rank))
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)
            lock.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def shards(width: int, sizes: list[int]) -> list[tuple[int, int]]:
    """(start, size) per rank: `sizes` cut points over `width` columns, the last rank takes the rest."""
    starts = sorted(min(s, width) for s in sizes)
    bounds = [0, *starts, width]
    return [(a, b - a) for a, b in itertools.pairwise(bounds)]


TIED = st.sampled_from([0.0, -0.5, -1.0, -1.0, -2.0, -2.0, -2.0, float("-inf")])  # many ties, some -inf


@st.composite
def sharded_rows(draw: st.DrawFn) -> tuple[torch.Tensor, list[tuple[int, int]], int]:
    vocab = draw(st.integers(1, 40))
    rows = draw(st.integers(1, 4))
    values = draw(st.lists(TIED, min_size=rows * vocab, max_size=rows * vocab))
    lp = torch.tensor(values, dtype=torch.float32).view(rows, vocab)
    lp[:, draw(st.integers(0, vocab - 1))] = 0.0  # every row has a finite best token
    cuts = draw(st.lists(st.integers(0, vocab), max_size=3))
    return lp, shards(vocab, cuts), draw(st.integers(1, min(vocab, 8)))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(case=sharded_rows())
def test_sharded_topk_equals_the_unsharded_one_ties_included(case: tuple[torch.Tensor, list, int]) -> None:
    lp, parts, k = case  # lp: [R, V] log-probs; parts: (start, size) per rank, some empty or smaller than k

    def rank(r: int, gather: Gather) -> tuple[torch.Tensor, torch.Tensor]:
        start, size = parts[r]
        return shard_topk(lp[:, start : start + size], start, k, gather)

    results = on_ranks(len(parts), rank)
    want_vals, want_ids = batch_row_topk(lp, k)
    host_vals, host_ids = row_topk(lp, k)  # the order's definition: (log-prob desc, token id asc)
    for vals, ids in results:  # the same on every rank
        assert torch.equal(ids, want_ids) and torch.equal(ids, host_ids)
        assert torch.equal(vals, want_vals) and torch.equal(vals, host_vals)


def test_a_tie_across_the_boundary_goes_to_the_smaller_id() -> None:
    lp = torch.full((1, 10), -5.0)
    lp[0, [3, 4, 5, 6]] = -1.0  # four tied tokens: two on each side of the boundary at 5
    parts = [(0, 5), (5, 5)]
    results = on_ranks(2, lambda r, g: shard_topk(lp[:, parts[r][0] : sum(parts[r])], parts[r][0], 3, g))
    assert [ids.tolist() for _, ids in results] == [[[3, 4, 5]], [[3, 4, 5]]]
    # the merge alone: candidates arrive in rank order, not id order
    every = torch.tensor([[[[-1.0, 7.0], [-1.0, 9.0]]], [[[-1.0, 2.0], [-3.0, 1.0]]]], dtype=torch.float64)
    assert merge_topk(every, 3)[1].tolist() == [[2, 7, 9]]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**16), cuts=st.lists(st.integers(0, 50), min_size=1, max_size=3))
def test_shard_logprobs_normalize_over_the_whole_vocabulary(seed: int, cuts: list[int]) -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(seed)) * 5
    parts = shards(50, cuts)
    results = on_ranks(len(parts), lambda r, g: shard_logprobs(logits[:, parts[r][0] : sum(parts[r])], g))
    torch.testing.assert_close(torch.cat(results, dim=1), torch.log_softmax(logits, dim=-1), atol=1e-5, rtol=0)


def test_trees_from_the_merged_topk_equal_the_batched_build() -> None:
    g = torch.Generator().manual_seed(3)
    lp = torch.log_softmax(torch.randint(-3, 3, (2, 5, 30), generator=g).float(), dim=-1)  # integer logits: ties
    parts = [(0, 11), (11, 4), (15, 15)]

    def rank(r: int, gather: Gather) -> Any:
        start, size = parts[r]
        vals, ids = shard_topk(lp.reshape(10, 30)[:, start : start + size], start, 6, gather)
        return build_trees_from_topk(vals.view(2, 5, 6), ids.view(2, 5, 6), torch.tensor([1, 2]), 12)

    want = build_trees_batched(lp, torch.tensor([1, 2]), 12, 6)
    for trees in on_ranks(3, rank):
        for name in ("tokens", "parents", "depths", "scores"):
            assert torch.equal(getattr(trees, name), getattr(want, name)), name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("split", ["23,17", "20,1,19"])  # 2 ranks; 3 ranks, one shard smaller than k
def test_real_processes_plan_the_same_trees_as_tp1(tmp_path: Path, split: str) -> None:
    world, port = len(split.split(",")), str(free_port())
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'runtime'}:{HERE}", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "tp_gloo_worker.py"), str(tmp_path), str(r), str(world), port, split],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    for p in procs:
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, output[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    first = got[0]
    for other in got[1:]:  # identical trees on every rank
        assert torch.equal(other["ids"], first["ids"]) and torch.equal(other["vals"], first["vals"])
        for name, value in first["plan"].items():
            assert torch.equal(other["plan"][name], value), name
    for name, value in first["reference"].items():  # the same trees as TP 1 (integer logits: exact ties)
        assert torch.equal(first["plan"][name], value), name
    ours, tp1 = first["scores"]
    torch.testing.assert_close(ours, tp1, atol=1e-5, rtol=0)  # log-probs differ by rounding only
    want_vals, want_ids = batch_row_topk(first["full"].reshape(-1, first["full"].shape[-1]), 4)
    assert torch.equal(first["ids"].reshape(-1, 4), want_ids)
    torch.testing.assert_close(first["vals"].reshape(-1, 4), want_vals, atol=1e-5, rtol=0)
    assert (first["ids"] < sum(int(x) for x in split.split(","))).all()  # no padding candidate survives


class ThreadGroup:
    """The two members of SGLang's GroupCoordinator the plugin uses, over `Lockstep` threads."""

    def __init__(self, gather: Gather, rank: int, world: int) -> None:
        self.gather, self.rank_in_group, self.world_size = gather, rank, world

    def all_gather_into_tensor(self, output: torch.Tensor, local: torch.Tensor) -> None:
        output.copy_(self.gather(local).reshape(output.shape))


def test_shadow_statistics_from_a_sharded_head_equal_the_unsharded_ones() -> None:
    """observe_draft_sharded (TP > 1, through group_gather) builds the trees observe_draft builds from the whole
    head, on every rank; the spine check compares with DFLASH's argmax."""
    g = torch.Generator().manual_seed(1)
    bs, block, hidden, vocab = 3, 6, 8, 37
    config = DDTreeConfig(verify=Mode.SHADOW, budget=9, topk=3)
    weight = torch.randint(-2, 3, (vocab, hidden), generator=g).float()  # integer logits: exact, with ties
    states = torch.randint(-1, 2, (bs * (block - 1), hidden), generator=g).float()
    argmax = (states @ weight.T).argmax(-1)  # DFLASH's tokens (first maximum: the smallest id)
    want = observe_draft(states, weight, argmax, block, config)
    parts = [(0, 20), (20, 17)]

    def rank(r: int, gather: Gather) -> Any:
        start, size = parts[r]
        head = HeadShard(weight[start : start + size], start, vocab, 2, r, ThreadGroup(gather, r, 2))
        return observe_draft_sharded(states, head, argmax, block, config)

    for got in on_ranks(2, rank):
        assert (got.nodes, got.depth, got.width) == (want.nodes, want.depth, want.width)
        assert got.spine_matches and want.spine_matches
