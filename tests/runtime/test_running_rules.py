"""The rules' running output (`ddtree.acceptance.RunningRules`): token counts kept as each commit adds tokens give
the rows that a recount of the whole history gives, bit for bit, and the rows a tree round's nodes get (base
counts + the node's path); the reference engine's running counts after many rounds equal a recount of what it
output, through a stop inside a round and into the next request."""

from __future__ import annotations

import pytest
import torch
from ddtree.acceptance import (
    Decoding,
    RequestRules,
    RunningRules,
    apply_node_rules,
    batch_rules,
    chain_layout,
)
from ddtree.config import DDTreeConfig
from ddtree.engine import Mode, OracleNoiseDrafter, ReferenceEngine
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_targets import dense_target, one_thread

pytestmark = [pytest.mark.runtime, pytest.mark.usefixtures("one_thread")]
__all__ = ["one_thread"]  # the fixture, imported for pytest

VOCAB = 64
CPU = torch.device("cpu")

RULES = st.builds(
    RequestRules,
    frequency_penalty=st.sampled_from([0.0, 0.5, -1.25, 1.5, 0.1]),
    presence_penalty=st.sampled_from([0.0, 0.8, -0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.7]),
    min_new_tokens=st.integers(0, 12),
    stop_token_ids=st.frozensets(st.integers(0, VOCAB - 1), max_size=3),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-5.0, 5.0), max_size=3),
)
# tokens out of the vocabulary count towards the length only, as batch_rules counts them
CHUNKS = st.lists(st.lists(st.integers(-1, VOCAB), max_size=6), min_size=1, max_size=8)


def recount(history: list[int]) -> torch.Tensor:
    """[V] how often each token is in `history`, counted afresh."""
    counts = torch.zeros(VOCAB)
    for token in history:
        if 0 <= token < VOCAB:
            counts[token] += 1
    return counts


def recounted_row(logits: torch.Tensor, rules: RequestRules, history: list[int]) -> torch.Tensor:
    """The baseline's row after `history`, its counts built from the whole history (batch_rules)."""
    batch = batch_rules([rules], [history], VOCAB, CPU, force=True)
    assert batch is not None
    node = torch.zeros((1, 1), dtype=torch.int64)
    return apply_node_rules(logits.view(1, 1, VOCAB), node, torch.ones((1, 1, 1), dtype=torch.bool), node, batch)[0, 0]


@settings(max_examples=150, deadline=None)
@given(rules=RULES, chunks=CHUNKS, seed=st.integers(0, 2**16))
def test_running_rows_equal_a_recount_of_the_whole_history(
    rules: RequestRules, chunks: list[list[int]], seed: int
) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    running = RunningRules(rules, VOCAB, CPU)
    history: list[int] = []
    for chunk in [[], *chunks]:
        running.commit(chunk)
        history += chunk
        assert running.length == len(history)
        assert torch.equal(running.adjust(logits), recounted_row(logits, rules, history))
        if rules.reads_output:
            assert torch.equal(running.counts[0], recount(history))


@settings(max_examples=100, deadline=None)
@given(rules=RULES, history=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), data=st.data())
def test_committing_a_path_node_by_node_gives_the_tree_rows_of_its_nodes(
    rules: RequestRules, history: list[int], data: st.DataObject
) -> None:
    """A tree round's rows (`apply_node_rules`: base counts + each node's path, one batched op, as the SGLang
    round computes them) are the rows a walk gets by committing the accepted path node by node (the reference
    engine's), bit for bit."""
    path = data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=6))
    width = len(path) + 1  # the root (the newest output token), then the path
    logits = torch.randn((1, width, VOCAB), generator=torch.Generator().manual_seed(len(history))) * 3
    mask, depths = chain_layout(width, 1, CPU)
    tokens = torch.tensor([[history[-1], *path]])
    base = batch_rules([rules], [history], VOCAB, CPU, force=True)
    assert base is not None
    rows = apply_node_rules(logits, tokens, mask, depths, base)  # [1, W, V]
    running = RunningRules(rules, VOCAB, CPU)
    running.commit(history)
    for depth in range(width):
        if depth:
            running.commit([path[depth - 1]])
        assert torch.equal(running.adjust(logits[0, depth]), rows[0, depth]), f"depth {depth}"


PENALISED = Decoding(
    rules=RequestRules(frequency_penalty=0.7, presence_penalty=0.4, repetition_penalty=1.3, min_new_tokens=6)
)
CFG = DDTreeConfig(budget=12, topk=3, log_interval=10_000)


def _engines(target: torch.nn.Module) -> dict[Mode, ReferenceEngine]:
    drafter = OracleNoiseDrafter(target, 5, noise=0.05, seed=0, lookahead=60, temp=0.1)
    return {
        Mode.BASELINE: ReferenceEngine(target, Mode.BASELINE),
        Mode.LINEAR: ReferenceEngine(target, Mode.LINEAR, drafter=drafter, ddtree=CFG),
        Mode.TREE: ReferenceEngine(target, Mode.TREE, drafter=drafter, ddtree=CFG),
    }


def _check_each_round(engine: ReferenceEngine, chunks: list[list[int]], upto: int) -> None:
    """Streams are checked while they run: after chunk i the running counts are the recount of chunks 0..i."""
    assert engine.last_rules is not None
    output = [t for chunk in chunks[: upto + 1] for t in chunk]
    assert engine.last_rules.length == len(output), f"{engine.mode.value} round {upto}"
    assert torch.equal(engine.last_rules.counts[0], recount(output)), f"{engine.mode.value} round {upto}"


def test_the_engines_running_counts_equal_a_recount_of_the_output_after_many_rounds() -> None:
    target = dense_target(VOCAB, seed=0)
    prompt = [5, 17, 3, 40, 22]
    for mode, engine in _engines(target).items():
        chunks: list[list[int]] = []
        for i, chunk in enumerate(engine.stream(prompt, 48, decoding=PENALISED)):
            chunks.append(chunk)
            _check_each_round(engine, chunks, i)
        assert len(chunks) >= 8, mode  # many rounds
        if mode is Mode.TREE:
            assert max(len(c) for c in chunks) > 1  # rounds committed several tokens each


def test_a_stop_inside_a_round_and_the_next_request_start_from_their_own_output() -> None:
    target = dense_target(VOCAB, seed=0)
    engines = _engines(target)
    prompt = [9, 2, 33, 14]
    full = engines[Mode.BASELINE].generate(prompt, 40, decoding=PENALISED).tokens
    stop = full[20]
    cut = full[: full.index(stop) + 1]
    for mode, engine in engines.items():
        chunks: list[list[int]] = []
        for i, chunk in enumerate(engine.stream(prompt, 40, stop_token_ids=[stop], decoding=PENALISED)):
            chunks.append(chunk)
            if sum(map(len, chunks)) < len(cut):  # the last chunk may be cut at the stop inside its round
                _check_each_round(engine, chunks, i)
        assert [t for c in chunks for t in c] == cut, mode
        # the next request counts its own output only: nothing of the last one's carries over
        other = engine.generate([7, 7, 1], 24, decoding=PENALISED)
        assert engine.last_rules is not None
        assert torch.equal(engine.last_rules.counts[0], recount(other.tokens)), mode
        assert engine.last_rules.length == len(other.tokens), mode
