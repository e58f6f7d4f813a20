"""`ddtree.sglang.penalty_counts.OutputCounts`: the running [bs, V] counts of a decode batch's outputs equal a
recount of every request's whole `output_ids` (what `batch_rules` counts) after every round of a scheduler's
life: commits of several tokens, requests finishing and leaving (ScheduleBatch.filter_batch), prefilled requests
joining (merge_batch), a retracted request coming back, an output cut back. Pure torch over stand-in requests."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from ddtree.acceptance import RequestRules, batch_rules
from ddtree.sglang.penalty_counts import OutputCounts
from ddtree.sglang.request_kinds import rules_of_batch
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime

VOCAB = 32
CPU = torch.device("cpu")
PENALISED = RequestRules(frequency_penalty=0.5)


@dataclasses.dataclass(eq=False)  # identity, as SGLang's Req
class Req:
    rid: str
    output_ids: list[int]
    reads: bool


def recount(reqs: list[Req]) -> torch.Tensor:
    """batch_rules' counts of the whole outputs: the rows a round built from the host before."""
    rules = [PENALISED if r.reads else RequestRules(logit_bias={0: 1.0}) for r in reqs]
    batch = batch_rules(rules, [list(r.output_ids) for r in reqs], VOCAB, CPU, force=True)
    assert batch is not None
    return batch.counts


OPS = st.lists(
    st.tuples(st.sampled_from(["commit", "finish", "merge", "retract", "return", "cut"]), st.integers(0, 2**16)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, first=st.integers(1, 4))
def test_running_counts_equal_a_recount_through_commits_filter_merge_and_retraction(
    ops: list[tuple[str, int]], first: int
) -> None:
    g = torch.Generator().manual_seed(len(ops))
    made = 0

    def new_req(length: int) -> Req:
        nonlocal made
        made += 1
        tokens = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        return Req(f"r{made}", tokens, reads=made % 3 != 0)  # every third request's rules read no output

    batch = [new_req(1) for _ in range(first)]  # just prefilled: the prefill's token
    retracted: list[Req] = []
    counts = OutputCounts(VOCAB, CPU)
    for op, arg in ops:
        if op == "commit":  # a round commits 1..6 tokens per request (accepted drafts + the bonus)
            for req in batch:
                req.output_ids += torch.randint(0, VOCAB, (1 + (arg + len(req.output_ids)) % 6,), generator=g).tolist()
        elif op == "finish" and batch:  # filter_batch: the rest keep their order
            del batch[arg % len(batch)]
        elif op == "merge":  # merge_batch: prefilled requests join at the end
            batch += [new_req(1 + arg % 3) for _ in range(1 + arg % 2)]
        elif op == "retract" and batch:
            retracted.append(batch.pop(arg % len(batch)))
        elif op == "return" and retracted:  # back after its re-prefill, its output kept
            batch.append(retracted.pop(0))
        elif op == "cut" and batch:  # an output cut back (a retraction that reset it)
            req = batch[arg % len(batch)]
            req.output_ids = req.output_ids[: arg % (len(req.output_ids) + 1)]
        got = counts.sync(batch, [r.reads for r in batch])
        assert got.shape == (len(batch), VOCAB)
        assert torch.equal(got, recount(batch)), f"after {op}"


def test_a_round_adds_only_the_new_tokens_and_unchanged_batches_reuse_their_rows() -> None:
    reqs = [Req("a", [1, 2, 2], True), Req("b", [3], True)]
    counts = OutputCounts(VOCAB, CPU)
    first = counts.sync(reqs, [True, True])
    assert first[0, 2] == 2 and first[1, 3] == 1
    reqs[0].output_ids += [2, 5]
    second = counts.sync(reqs, [True, True])
    assert second.data_ptr() == first.data_ptr()  # same batch: updated in place, no rebuild
    assert second[0, 2] == 3 and second[0, 5] == 1 and second[1].sum() == 1
    merged = counts.sync([reqs[1], Req("c", [7], True)], [True, True])  # a finished, c joined
    assert merged[0, 3] == 1 and merged[0].sum() == 1 and merged[1, 7] == 1


def test_mismatched_flags_are_refused() -> None:
    with pytest.raises(ValueError, match="2 requests for 1 reading flags"):
        OutputCounts(VOCAB, CPU).sync([Req("a", [], True), Req("b", [], True)], [True])


def sglang_req(rid: str, output: list[int], **params: float) -> SimpleNamespace:
    fields = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    sampling = SimpleNamespace(stop_token_ids=None, **{**fields, **params})
    return SimpleNamespace(rid=rid, output_ids=output, sampling_params=sampling, eos_token_ids={1}, tokenizer=None)


def test_the_rules_of_a_batch_are_the_same_with_running_counts_round_after_round() -> None:
    """rules_of_batch with the worker's running counts gives the BatchRules a recount gives, every field equal,
    while the batch commits, loses a request and gains one."""
    g = torch.Generator().manual_seed(0)
    reqs = [
        sglang_req("a", [4], frequency_penalty=0.5, min_new_tokens=9),
        sglang_req("b", [6]),  # no rule that reads the output: a zero row
        sglang_req("c", [9], repetition_penalty=1.3, presence_penalty=0.2),
    ]
    bias = torch.zeros(3, VOCAB)
    running = OutputCounts(VOCAB, CPU)
    for step in range(12):
        for req in reqs:
            req.output_ids += torch.randint(0, VOCAB, (1 + step % 4,), generator=g).tolist()
        if step == 5:  # b finishes, d joins
            reqs = [reqs[0], reqs[2], sglang_req("d", [3, 3], frequency_penalty=-1.0)]
        batch = SimpleNamespace(reqs=reqs, sampling_info=SimpleNamespace(logit_bias=bias[: len(reqs)]))
        want = rules_of_batch(batch, VOCAB, CPU)
        got = rules_of_batch(batch, VOCAB, CPU, running)
        assert want is not None and got is not None
        for field in dataclasses.fields(want):
            assert torch.equal(getattr(got, field.name), getattr(want, field.name)), f"step {step}: {field.name}"
