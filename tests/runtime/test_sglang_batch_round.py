"""ddtree.sglang.batch_round: the round's device path (plan_batch, full_mask_batched, commit_batch, StatsQueue)
equals the per-request host references (tree_round.plan_round / commit_round, ddtree.stats.round_stats,
MetricsLog fed one request at a time) on random trees: ties, off-spine acceptance, padding requests,
budget = block - 1, budget 1 and wide trees included."""

from __future__ import annotations

import logging

import pytest
import torch
from ddtree.config import DDTreeConfig, HybridMode
from ddtree.metrics import MetricsLog
from ddtree.sglang.batch_round import (
    STAT_FIELDS,
    StatsQueue,
    commit_batch,
    full_mask_batched,
    full_mask_numel,
    plan_batch,
    stats_tensor,
)
from ddtree.sglang.devcheck import random_path_verify
from ddtree.sglang.tree_round import TreeCommit, TreeRound, commit_round, plan_round
from ddtree.stats import RoundStats, round_stats
from ddtree.tree import tree_shape
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_inputs import KINDS, batch_logprobs

pytestmark = pytest.mark.runtime

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tree_stats(plan: TreeRound, commit: TreeCommit, times_ms: dict[str, float]) -> list[RoundStats]:
    """`ddtree.stats.round_stats` of a host reference round: each request's path, tree shape and spine."""
    shapes = [tree_shape(tree) for tree in plan.trees]
    return round_stats([len(path) for path in commit.paths], shapes, commit.off_spine, times_ms)


def assert_plan_equal(ref: TreeRound, lp: torch.Tensor, roots: torch.Tensor, prefixes: torch.Tensor, slots: int,
                      budget: int, topk: int) -> None:  # fmt: skip
    plan = plan_batch(lp, roots, prefixes, slots, budget, topk)
    bs = lp.shape[0]
    mask = full_mask_batched(plan.tree_mask, prefixes, full_mask_numel(int(prefixes.sum()), bs, slots))
    pairs = {
        "tokens": (ref.tokens, plan.tokens),
        "positions": (ref.positions, plan.positions),
        "custom_mask": (ref.custom_mask, mask),
        "retrieve_index": (ref.retrieve_index, plan.retrieve_index),
        "retrieve_next_token": (ref.retrieve_next_token, plan.retrieve_next_token),
        "retrieve_next_sibling": (ref.retrieve_next_sibling, plan.retrieve_next_sibling),
        "order": (torch.stack([lay.order for lay in ref.layouts]), plan.order),
        "parents": (torch.stack([lay.parents for lay in ref.layouts]), plan.parents),
        "tree_mask": (torch.stack([lay.tree_mask for lay in ref.layouts]), plan.tree_mask),
        "tree_tokens": (torch.stack([t.tokens for t in ref.trees]), plan.trees.tokens),
        "tree_scores": (torch.stack([t.scores for t in ref.trees]), plan.trees.scores),
    }
    for name, (want, got) in pairs.items():
        assert want.shape == got.shape and torch.equal(want, got.cpu()), f"{name}:\n{want}\n{got}"
        # SGLang's kernels take raw pointers and index [bs, S] rows by b * S: a strided view reads the wrong rows
        assert got.is_contiguous(), f"{name} is not contiguous (strides {got.stride()})"


def random_round(seed: int, bs: int, block: int, vocab: int, kinds: list[str]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lp = batch_logprobs(seed, bs, block - 1, vocab, kinds)  # [bs, B - 1, V]
    roots = torch.randint(0, vocab, (bs,), generator=g)
    prefixes = torch.randint(0, 40, (bs,), generator=g)
    return lp, roots, prefixes


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    bs=st.integers(1, 4),
    block=st.integers(2, 16),
    vocab=st.integers(1, 60),
    wide=st.booleans(),
    budget_pick=st.integers(0, 10**6),
    topk=st.integers(1, 10),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
)
def test_plan_batch_equals_plan_round(
    seed: int, bs: int, block: int, vocab: int, wide: bool, budget_pick: int, topk: int, kinds: list[str]
) -> None:
    slots = 2 * block if wide else block
    budget = 1 + budget_pick % (slots - 1)
    lp, roots, prefixes = random_round(seed, bs, block, vocab, kinds)
    ref = plan_round(lp, roots.tolist(), prefixes.tolist(), slots, budget, topk)
    assert_plan_equal(ref, lp, roots, prefixes, slots, budget, topk)


@pytest.mark.parametrize(("block", "budget", "slots"), [(16, 15, 16), (16, 1, 16), (8, 7, 8), (8, 15, 16), (2, 1, 2)])
@pytest.mark.parametrize("kind", KINDS)
def test_plan_batch_at_the_edges(block: int, budget: int, slots: int, kind: str) -> None:
    """budget = block - 1 (a full window), budget 1 (one node), a wide tree (2B - 1), the smallest block."""
    lp, roots, prefixes = random_round(block * 100 + budget, 3, block, 700, [kind])
    ref = plan_round(lp, roots.tolist(), prefixes.tolist(), slots, budget, 8)
    assert_plan_equal(ref, lp, roots, prefixes, slots, budget, 8)


def test_padding_requests_change_nothing_for_the_real_ones() -> None:
    """A batch padded to a captured size (CUDA graphs): padding requests (all-zero log-probs, root 0, prefix 0)
    get well-formed trees of their own and leave the real requests' plan and commit unchanged."""
    slots, budget, topk = 8, 7, 4
    lp, roots, prefixes = random_round(7, 3, slots, 50, ["continuous", "quantized"])
    pad = 2
    lp_p = torch.cat([lp, torch.zeros(pad, *lp.shape[1:])])
    roots_p = torch.cat([roots, torch.zeros(pad, dtype=roots.dtype)])
    prefixes_p = torch.cat([prefixes, torch.zeros(pad, dtype=prefixes.dtype)])
    alone = plan_batch(lp, roots, prefixes, slots, budget, topk)
    padded = plan_batch(lp_p, roots_p, prefixes_p, slots, budget, topk)
    for name in ("tokens", "parents", "depths", "tree_mask", "retrieve_next_token", "retrieve_next_sibling"):
        assert torch.equal(getattr(padded, name)[:3], getattr(alone, name)), name
    assert torch.equal(padded.positions[: 3 * slots], alone.positions)
    ref = plan_round(lp_p, roots_p.tolist(), prefixes_p.tolist(), slots, budget, topk)
    assert_plan_equal(ref, lp_p, roots_p, prefixes_p, slots, budget, topk)

    index, num, predict = random_path_verify(ref, 50, seed=3)
    index[3:], num[3:] = -1, 0  # padding requests: verify_tree_greedy's untouched outputs
    index[3:, 0] = torch.arange(3, 5) * slots
    commit = commit_batch(padded, index, num, predict)
    commit_alone = commit_batch(alone, index[:3], num[:3], predict[:3])
    for name in ("out_tokens", "commit_lens", "bonus", "perm", "off_spine"):
        assert torch.equal(getattr(commit, name)[:3], getattr(commit_alone, name)), name
    assert commit.commit_lens[3:].tolist() == [1, 1] and not commit.bad_path.any()


@pytest.mark.parametrize(("block", "slots", "budget", "topk"), [(8, 8, 7, 3), (8, 8, 1, 1), (8, 16, 15, 8)])
def test_commit_batch_equals_commit_round_including_off_spine(block: int, slots: int, budget: int, topk: int):
    off_spine = deeper = 0
    for seed in range(25):
        bs = 1 + seed % 4
        lp, roots, prefixes = random_round(seed, bs, block, 40, [KINDS[seed % len(KINDS)]])
        ref = plan_round(lp, roots.tolist(), prefixes.tolist(), slots, budget, topk)
        plan = plan_batch(lp, roots, prefixes, slots, budget, topk)
        index, num, predict = random_path_verify(ref, 40, seed=100 + seed)
        want = commit_round(ref, index, num, predict)
        got = commit_batch(plan, index, num, predict)
        assert torch.equal(got.out_tokens, want.out_tokens)
        assert torch.equal(got.commit_lens, want.commit_lens) and got.commit_lens.dtype == torch.int32
        assert torch.equal(got.bonus, want.bonus)
        assert torch.equal(got.perm, want.perm)
        assert got.off_spine.tolist() == want.off_spine
        assert [row[row >= 0].tolist() for row in got.path] == want.paths
        assert not got.bad_path.any()
        stats = stats_tensor(plan, got).tolist()
        for row, ref_stats in zip(stats, tree_stats(ref, want, {}), strict=True):
            fields = dict(zip(STAT_FIELDS, row, strict=True))
            assert fields["accepted_len"] == ref_stats.accepted_len and fields["nodes"] == ref_stats.nodes
            assert fields["depth"] == ref_stats.depth and fields["width"] == ref_stats.width
            assert bool(fields["off_spine"]) == ref_stats.off_spine and fields["bad_path"] == 0
        off_spine += sum(want.off_spine)
        deeper += sum(len(p) > 2 for p in want.paths)
    if budget > 1:
        assert off_spine >= 5 and deeper >= 5


def test_commit_batch_flags_bad_paths_and_the_stats_queue_raises() -> None:
    lp, roots, prefixes = random_round(1, 3, 8, 30, ["continuous"])
    plan = plan_batch(lp, roots, prefixes, 8, 2, 1)  # 3 real nodes (a chain), 5 padding slots
    index = torch.full((3, 8), -1)
    index[0, :2] = torch.tensor([0, 5])  # through a padding slot
    index[1, :2] = torch.tensor([8 + 1, 8 + 2])  # not from the root
    index[2, :3] = torch.tensor([16, 17, 18])  # a good chain
    commit = commit_batch(plan, index, torch.tensor([1, 1, 2]), torch.zeros((3, 8), dtype=torch.int64))
    assert commit.bad_path.tolist() == [True, True, False]
    skip = torch.tensor([[0, 2, -1, -1, -1, -1, -1, -1]])  # skips a level: slot 2's parent is slot 1
    one = plan_batch(lp[:1], roots[:1], prefixes[:1], 8, 2, 1)
    assert commit_batch(one, skip, torch.tensor([1]), torch.zeros((1, 8), dtype=torch.int64)).bad_path.item()
    queue = StatsQueue(MetricsLog(DDTreeConfig(log_interval=50), 8, HybridMode.NONE))
    with pytest.raises(RuntimeError, match="bad path"):
        queue.push(stats_tensor(plan, commit), {})


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def make_log(name: str, interval: int) -> tuple[MetricsLog, Lines]:
    logger = logging.getLogger(f"ddtree.test.{name}")
    logger.propagate, logger.level = False, logging.INFO
    handler = Lines()
    logger.handlers = [handler]
    return MetricsLog(DDTreeConfig(log_interval=interval), 8, HybridMode.NONE, logger=logger), handler


@pytest.mark.parametrize(("interval", "sizes"), [(5, [3, 3, 1, 4, 4, 2, 3]), (1, [2, 1, 3]), (50, [4] * 20)])
def test_stats_queue_emits_the_per_request_lines_reading_once_per_line(interval: int, sizes: list[int]) -> None:
    direct, direct_lines = make_log(f"direct{interval}", interval)
    queued, queued_lines = make_log(f"queued{interval}", interval)
    queue = StatsQueue(queued)
    for i, bs in enumerate(sizes):
        lp, roots, prefixes = random_round(i, bs, 8, 30, ["continuous", "quantized"])
        ref = plan_round(lp, roots.tolist(), prefixes.tolist(), 8, 7, 3)
        plan = plan_batch(lp, roots, prefixes, 8, 7, 3)
        index, num, predict = random_path_verify(ref, 30, seed=i)
        ms = {"draft": 1.0 + i, "build": 0.5, "verify": 3.0, "commit": 0.25 * i}
        for stats in tree_stats(ref, commit_round(ref, index, num, predict), ms):
            direct.record(stats)
        queue.push(stats_tensor(plan, commit_batch(plan, index, num, predict)), ms)
    assert queued_lines.lines == direct_lines.lines
    assert any(line.startswith("DDTREE metrics") for line in direct_lines.lines) == (sum(sizes) >= interval)
    emitting_rounds, records = 0, 0
    for bs in sizes:  # rounds whose records reach a line: the first, then each that fills a window
        before = records
        records += bs
        emitting_rounds += before == 0 or records // interval > before // interval
    assert queue.reads == emitting_rounds < len(sizes) or interval == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_plan_and_commit_equal_the_references_and_replay_in_a_graph() -> None:
    slots, budget, topk = 16, 15, 8
    lp, roots, prefixes = random_round(4, 6, slots, 5000, ["peaked_ties", "continuous", "quantized"])
    ref = plan_round(lp, roots.tolist(), prefixes.tolist(), slots, budget, topk)
    dev = torch.device("cuda")
    lp_d, roots_d, prefixes_d = lp.to(dev), roots.to(dev), prefixes.to(dev)
    assert_plan_equal(ref, lp_d, roots_d, prefixes_d, slots, budget, topk)
    index, num, predict = random_path_verify(ref, 5000, seed=9)
    want = commit_round(ref, index, num, predict)
    index_d, num_d, predict_d = index.to(dev), num.to(dev), predict.to(dev)

    def step() -> tuple[torch.Tensor, ...]:
        plan = plan_batch(lp_d, roots_d, prefixes_d, slots, budget, topk)
        commit = commit_batch(plan, index_d, num_d, predict_d)
        return plan.tokens, plan.retrieve_next_token, commit.perm, commit.out_tokens

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(captured[0].cpu(), ref.tokens)
    assert torch.equal(captured[2].cpu(), want.perm) and torch.equal(captured[3].cpu(), want.out_tokens)
