"""Which round a decode batch takes in the tree worker, and the per-node choice of a tree round for every
request kind (docs/sglang.md, "Request kinds: which round each takes").

A tree round serves greedy and sampled rows, logit_bias, frequency / presence / repetition penalties and
min_new_tokens in one verify forward: each node's logits get the request's rules as the baseline applies them
at that node's position (`ddtree.acceptance`), then each node's choice comes from SGLang's own Sampler (the
baseline's backend, temperature, top-k, top-p, min-p; with --enable-deterministic-inference its noise is keyed
by (seed, position), and a node's position is the baseline's position for the same token, so seeded requests
get the baseline's tokens). What still takes DFLASH's chain round is named by `dflash_round_reason`.

Reads SGLang objects duck-typed (batch.reqs, req.sampling_params, SamplingBatchInfo); imports no sglang.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ddtree.acceptance import PENALTIES, BatchRules, RequestRules, apply_node_rules, batch_rules
from ddtree.sglang.penalty_counts import OutputCounts


def request_rules(req: Any) -> RequestRules:
    """One SGLang request's penalties and min_new_tokens (logit_bias is read from the batch's tensor). The stop
    tokens are the ones SGLang's BatchedMinNewTokensPenalizer suppresses."""
    params = req.sampling_params
    stops: set[int] = set(getattr(params, "stop_token_ids", None) or ())
    stops |= set(getattr(req, "eos_token_ids", None) or ())
    tokenizer = getattr(req, "tokenizer", None)
    if tokenizer is not None:
        stops |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        if getattr(tokenizer, "eos_token_id", None) is not None:
            stops.add(int(tokenizer.eos_token_id))
    return RequestRules(
        frequency_penalty=float(params.frequency_penalty or 0.0),
        presence_penalty=float(params.presence_penalty or 0.0),
        repetition_penalty=float(params.repetition_penalty if params.repetition_penalty is not None else 1.0),
        min_new_tokens=int(params.min_new_tokens or 0),
        stop_token_ids=frozenset(int(t) for t in stops if t is not None),
    )


def rules_of_batch(
    batch: Any, vocab: int, device: torch.device, running: OutputCounts | None = None
) -> BatchRules | None:
    """The batch's rules on the device (None when no request has one): penalties and min_new_tokens from each
    request's parameters and committed output, logit_bias from SamplingBatchInfo's own tensor. `running`: the
    worker's output counts kept across rounds (only the tokens committed since its last round are counted);
    without it every output is counted afresh on the host."""
    reqs = list(batch.reqs)
    rules = [request_rules(req) for req in reqs]
    bias = getattr(batch.sampling_info, "logit_bias", None)
    reading = [r.reads_output for r in rules]
    if running is not None and any(reading):
        counts = running.sync(reqs, reading)  # [bs, V] on the device
        lengths_only = [req.output_ids if reads else [] for req, reads in zip(reqs, reading, strict=True)]
        base = batch_rules(rules, lengths_only, vocab, device, force=bias is not None, counts=counts)
    else:
        outputs = [list(req.output_ids) if reads else [] for req, reads in zip(reqs, reading, strict=True)]
        base = batch_rules(rules, outputs, vocab, device, force=bias is not None)
    if base is None or bias is None:
        return base
    return dataclasses.replace(base, logit_bias=bias.to(device, torch.float32))


def baseline_penalty_order() -> tuple[str, ...]:
    """The order SGLang's non-speculative decode applies a batch's penalties in (ddtree.acceptance.PENALTIES):
    its orchestrator holds them in the iteration order of the set of penalizer classes
    `SamplingBatchInfo.from_schedule_batch` builds (classes hash by address), rebuilt here the same way in the
    same process. The repetition penalty's place in it changes logits, so the tree's rows must follow it; a
    spec worker's own batch (`copy_for_forward`) sums the additive ones first instead."""
    import sglang.srt.sampling.penaltylib as penaltylib

    names = {
        penaltylib.BatchedFrequencyPenalizer: "frequency",
        penaltylib.BatchedMinNewTokensPenalizer: "min_new_tokens",
        penaltylib.BatchedPresencePenalizer: "presence",
        penaltylib.BatchedRepetitionPenalizer: "repetition",
    }
    classes = {  # the literal of sampling_batch_info.py, in its order
        penaltylib.BatchedFrequencyPenalizer,
        penaltylib.BatchedMinNewTokensPenalizer,
        penaltylib.BatchedPresencePenalizer,
        penaltylib.BatchedRepetitionPenalizer,
    }
    return tuple(names[cls] for cls in classes)


def needs_node_rules(batch: Any) -> bool:
    """True when some request has a rule (penalty, min_new_tokens, logit_bias): host-side reads only."""
    info = batch.sampling_info
    if info is not None and getattr(info, "logit_bias", None) is not None:
        return True
    return reads_output(batch)


def reads_output(batch: Any) -> bool:
    """True when some request's rules read its output so far (penalties, min_new_tokens): DFLASH's chain round
    would get them wrong (it repeats one relaxed row per request), so the shape policy must not pick it."""
    return any(request_rules(req).reads_output for req in batch.reqs)


def policy_decides(batch: Any) -> bool:
    """Whether the shape policy picks this decode batch's round: greedy batches whose rules do not read the
    output. A batch whose rules read it always takes the configured tree (the policy's chain, DFLASH's round,
    would relax them); a batch with a sampled row too, so the policy's acceptance statistics, its chain and
    smaller-tree counterfactuals included, stay those of greedy rounds (a sampled row accepts by another law)."""
    info = batch.sampling_info
    greedy = info is None or bool(info.is_all_greedy)
    return greedy and not reads_output(batch)


def dflash_round_reason(batch: Any, tp_size: int, overlap: bool) -> str:
    """Why this decode batch takes DFLASH's chain round instead of a tree round; "" when a tree round serves it.
    Each reason is a request kind the tree round cannot serve exactly."""
    info = batch.sampling_info
    if batch.has_grammar and tp_size > 1:
        return "grammar-constrained requests at TP > 1 (the verify logits stay vocabulary-sharded)"
    if batch.return_logprob and tp_size > 1:
        return "log-prob requests at TP > 1 (the verify logits stay vocabulary-sharded)"
    if info is not None and getattr(info, "has_custom_logit_processor", False):
        return "custom logit processors (they see one row per request, not one per tree node)"
    sampled = info is not None and not info.is_all_greedy
    if tp_size > 1 and (sampled or needs_node_rules(batch)):
        return "sampling or logit rules at TP > 1 (the verify logits stay vocabulary-sharded)"
    if overlap and reads_output(batch):
        return "penalties or min_new_tokens under the overlap scheduler (the committed output lags a round)"
    return ""


def expanded_sampling_info(info: Any, slots: int) -> Any:
    """SamplingBatchInfo with every request's row repeated `slots` times (one per tree node), for the Sampler:
    temperature, top-k, top-p, min-p and seed per node; no logit rules (the nodes' logits carry them already),
    no custom processors, no sampling-mask capture."""

    def rep(value: Any) -> Any:
        return None if value is None else value.repeat_interleave(slots, dim=0)

    return dataclasses.replace(
        info,
        temperatures=rep(info.temperatures),
        top_ps=rep(info.top_ps),
        top_ks=rep(info.top_ks),
        min_ps=rep(info.min_ps),
        sampling_seed=rep(info.sampling_seed),
        logit_bias=None,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        penalizer_orchestrator=None,
        grammars=None,
        grammar_mask=None,
        has_custom_logit_processor=False,
        custom_params=None,
        custom_logit_processor=None,
        sampling_mask_batch_indices=None,
        sampling_support_logprobs_capture_indices=None,
        return_sampling_masks=None,
        return_sampling_support_logprobs=None,
        sampling_mask_top_ks=None,
    )


def node_choices(
    batch: Any,
    logits: Tensor,
    tokens: Tensor,
    tree_mask: Tensor,
    depths: Tensor,
    positions: Tensor,
    sampler: Any,
    rules: BatchRules | None,
    order: Sequence[str] = PENALTIES,
) -> tuple[Tensor, Tensor]:
    """([bs, S] the target's choice after each node, [bs, S, V] the rows it chose from: the logits with the
    rules applied, the ones the baseline's log-probs read). logits: [bs * S, V] the verify's; tokens, depths:
    [bs, S]; tree_mask: [bs, S, S]; positions: [bs * S], each node's position (prefix_len + depth, the
    baseline's position for the same token); sampler: SGLang's Sampler (model_runner.sampler); order: the
    penalties' order (`baseline_penalty_order`)."""
    bs, slots = tokens.shape
    rows = logits.view(bs, slots, -1)
    if rules is not None:
        rows = apply_node_rules(rows, tokens, tree_mask, depths, rules, order)
    info = batch.sampling_info
    if info is None or info.is_all_greedy:
        return torch.argmax(rows, dim=-1), rows
    flat = rows.reshape(bs * slots, -1).clone()  # the Sampler scales and softmaxes in place
    out = SimpleNamespace(next_token_logits=flat)
    choices = sampler(out, expanded_sampling_info(info, slots), False, [], [], positions)
    return choices.view(bs, slots).to(torch.int64), rows
