"""ddtree.sglang.request_kinds on SGLang-shaped fakes: which round a batch takes, the rules read from requests,
and the per-node choices (argmax, or a sampler given one row per node at the node's position)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ddtree.acceptance import chain_layout
from ddtree.sglang.request_kinds import (
    dflash_round_reason,
    expanded_sampling_info,
    needs_node_rules,
    node_choices,
    policy_decides,
    reads_output,
    request_rules,
    rules_of_batch,
)

pytestmark = pytest.mark.runtime
VOCAB = 10


@dataclasses.dataclass
class FakeInfo:  # the SamplingBatchInfo fields the module reads and replaces
    temperatures: torch.Tensor
    top_ps: torch.Tensor
    top_ks: torch.Tensor
    min_ps: torch.Tensor
    is_all_greedy: bool
    sampling_seed: torch.Tensor | None = None
    logit_bias: torch.Tensor | None = None
    acc_additive_penalties: Any = None
    acc_scaling_penalties: Any = None
    penalizer_orchestrator: Any = None
    grammars: Any = None
    grammar_mask: Any = None
    has_custom_logit_processor: bool = False
    custom_params: Any = None
    custom_logit_processor: Any = None
    sampling_mask_batch_indices: Any = None
    sampling_support_logprobs_capture_indices: Any = None
    return_sampling_masks: Any = None
    return_sampling_support_logprobs: Any = None
    sampling_mask_top_ks: Any = None


def req(output: list[int], **params: Any) -> SimpleNamespace:
    defaults = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0,
                "stop_token_ids": None}  # fmt: skip
    sp = SimpleNamespace(**{**defaults, **params})
    return SimpleNamespace(sampling_params=sp, output_ids=output, eos_token_ids={2}, tokenizer=None)


def info(bs: int, greedy: bool = True, **fields: Any) -> FakeInfo:
    return FakeInfo(
        temperatures=torch.ones(bs, 1), top_ps=torch.ones(bs), top_ks=torch.ones(bs, dtype=torch.int64),
        min_ps=torch.zeros(bs), is_all_greedy=greedy, **fields,
    )  # fmt: skip


def batch(reqs: list[SimpleNamespace], **flags: Any) -> SimpleNamespace:
    defaults = {"has_grammar": False, "return_logprob": False, "sampling_info": info(len(reqs))}
    return SimpleNamespace(reqs=reqs, **{**defaults, **flags})


def test_round_reasons() -> None:
    plain = batch([req([1])])
    assert dflash_round_reason(plain, tp_size=1, overlap=False) == ""
    grammar = batch([req([1])], has_grammar=True)  # one mask per tree node at TP 1; sharded logits at TP > 1
    assert dflash_round_reason(grammar, 1, False) == "" and "grammar" in dflash_round_reason(grammar, 2, False)
    assert dflash_round_reason(batch([req([1])], return_logprob=True), 1, False) == ""
    assert "TP > 1" in dflash_round_reason(batch([req([1])], return_logprob=True), 2, False)
    sampled = batch([req([1])], sampling_info=info(1, greedy=False))
    assert dflash_round_reason(sampled, 1, False) == "" and "TP > 1" in dflash_round_reason(sampled, 2, False)
    penalised = batch([req([1], frequency_penalty=0.5)])
    assert dflash_round_reason(penalised, 1, False) == "" and "overlap" in dflash_round_reason(penalised, 1, True)
    custom = batch([req([1])], sampling_info=info(1, has_custom_logit_processor=True))
    assert "custom logit processors" in dflash_round_reason(custom, 1, False)
    assert dflash_round_reason(plain, 2, False) == ""  # greedy at TP > 1 takes trees


def test_rules_come_from_the_requests_and_the_batch_bias() -> None:
    rule = request_rules(req([1, 2], min_new_tokens=3, stop_token_ids={7}))
    assert rule.min_new_tokens == 3 and rule.stop_token_ids == frozenset({2, 7})
    assert (
        not needs_node_rules(batch([req([1])]))
        and rules_of_batch(batch([req([1])]), VOCAB, torch.device("cpu")) is None
    )
    bias = torch.zeros(1, VOCAB)
    bias[0, 4] = -100.0
    biased = batch([req([1])], sampling_info=info(1, logit_bias=bias))
    assert needs_node_rules(biased) and not reads_output(biased)
    rules = rules_of_batch(biased, VOCAB, torch.device("cpu"))
    assert rules is not None and rules.logit_bias is not None and float(rules.logit_bias[0, 4]) == -100.0
    counted = rules_of_batch(batch([req([3, 3, 5], frequency_penalty=1.0)]), VOCAB, torch.device("cpu"))
    assert counted is not None and counted.counts[0, 3] == 2 and counted.output_lens.tolist() == [3]


def test_expanded_info_repeats_each_row_once_per_node_and_drops_the_rules() -> None:
    base = info(2, greedy=False, sampling_seed=torch.tensor([5, 6]), logit_bias=torch.ones(2, VOCAB))
    base.temperatures = torch.tensor([[0.5], [1.0]])
    wide = expanded_sampling_info(base, 3)
    assert wide.temperatures.view(-1).tolist() == [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]
    assert wide.sampling_seed.tolist() == [5, 5, 5, 6, 6, 6] and wide.logit_bias is None
    assert base.logit_bias is not None  # the batch's own info is untouched


def test_node_choices_argmax_for_greedy_and_the_sampler_at_each_nodes_position() -> None:
    logits = torch.randn(2 * 3, VOCAB)
    tokens = torch.tensor([[1, 4, 4], [2, 5, 6]])
    mask, depths = chain_layout(3, 2, torch.device("cpu"))
    positions = torch.tensor([10, 11, 12, 20, 21, 22])
    greedy, rows = node_choices(batch([req([1]), req([2])]), logits, tokens, mask, depths, positions, None, None)
    assert torch.equal(greedy, logits.view(2, 3, VOCAB).argmax(-1)) and torch.equal(rows, logits.view(2, 3, VOCAB))
    seen: dict[str, Any] = {}

    def sampler(out: Any, wide: Any, logprob: bool, top: list[int], ids: list[int], pos: torch.Tensor) -> torch.Tensor:
        seen.update(rows=out.next_token_logits.shape[0], pos=pos.tolist(), temps=wide.temperatures.view(-1).tolist())
        return torch.arange(6, dtype=torch.int32)

    sampled = batch([req([1]), req([2])], sampling_info=info(2, greedy=False))
    choices, _ = node_choices(sampled, logits, tokens, mask, depths, positions, sampler, None)
    assert choices.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert seen == {"rows": 6, "pos": positions.tolist(), "temps": [1.0] * 6}


def test_the_policy_decides_only_greedy_batches_whose_rules_leave_the_output_alone() -> None:
    assert policy_decides(batch([req([1]), req([2])]))
    bias = torch.zeros(1, VOCAB)
    assert policy_decides(batch([req([1])], sampling_info=info(1, logit_bias=bias)))  # a bias reads no output
    assert not policy_decides(batch([req([1], frequency_penalty=0.5)]))
    assert not policy_decides(batch([req([1]), req([2])], sampling_info=info(2, greedy=False)))
