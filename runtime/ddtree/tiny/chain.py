"""A minimal greedy chain-verify loop (linear mode) to measure a drafter's acceptance length.

Deliberately naive and independent of `ddtree.engine`: every round re-runs the target over the whole committed
sequence plus the drafted chain (no target KV cache), so it is obviously right and serves as a cross-check.
tau = committed tokens per round including the bonus token (SGLang's "accept len").
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ddtree.drafter import DFlashDraftModel, extract_context_feature


@dataclass(frozen=True)
class ChainResult:
    tokens: list[int]  # generated tokens (stop token included when hit)
    accept_lengths: list[int]  # per round, including the bonus token

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))


def _stop_index(tokens: list[int], stop: Collection[int], limit: int) -> int:
    for i, t in enumerate(tokens[:limit]):
        if t in stop:
            return i + 1
    return min(len(tokens), limit)


@torch.no_grad()
def greedy_baseline(
    target: PreTrainedModel, prompt: list[int], max_new_tokens: int, stop: Collection[int] = ()
) -> list[int]:
    """Plain greedy decoding with full recompute per token."""
    seq = list(prompt)
    out: list[int] = []
    while len(out) < max_new_tokens:
        t = int(target(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
        out.append(t)
        seq.append(t)
        if t in stop:
            break
    return out


@torch.no_grad()
def greedy_chain(
    target: PreTrainedModel,
    drafter: DFlashDraftModel,
    prompt: list[int],
    max_new_tokens: int,
    stop: Collection[int] = (),
) -> ChainResult:
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    layer_ids = drafter.target_layer_ids
    ctx = drafter.new_context()
    dev = target.device
    first = target(input_ids=torch.tensor([prompt], device=dev), output_hidden_states=True)
    drafter.extend_context(ctx, extract_context_feature(first.hidden_states, layer_ids))  # positions 0..P-1
    bonus = int(first.logits[0, -1].argmax())
    committed = list(prompt)
    out: list[int] = []
    accepts: list[int] = []
    while True:
        out.append(bonus)
        if bonus in stop or len(out) >= max_new_tokens:
            break
        # draft the chain after the bonus (bonus at position len(committed))
        logprobs = drafter.draft_logprobs_cached(ctx, torch.tensor([bonus], device=dev), embed, head)  # [1, D, V]
        chain = logprobs[0].argmax(-1).tolist()  # [D]
        block = [bonus, *chain]
        res = target(input_ids=torch.tensor([committed + block], device=dev), output_hidden_states=True)
        pred = res.logits[0, len(committed) :].argmax(-1).tolist()  # target's token after each block slot
        n_acc = 0
        while n_acc < len(chain) and chain[n_acc] == pred[n_acc]:
            n_acc += 1
        accepted = block[: n_acc + 1]  # bonus + accepted drafts: their hidden states are now final
        feats = extract_context_feature(res.hidden_states, layer_ids)
        drafter.extend_context(ctx, feats[:, len(committed) : len(committed) + len(accepted)])
        committed += accepted
        accepts.append(len(accepted))
        out.extend(accepted[1:])
        bonus = pred[n_acc]
        if any(t in stop for t in accepted[1:]) or len(out) >= max_new_tokens:
            break
    return ChainResult(out[: _stop_index(out, stop, max_new_tokens)], accepts)
