"""The drafter's top-k for the tree from a vocab-parallel LM head (SGLang at TP > 1). Pure torch: the collective
comes in as a `Gather` function, so the same code runs on SGLang's TP group, on a gloo group in the tests, and
on one process (TP 1: no gather at all).

At TP > 1 rank r holds the head's rows for tokens [start_r, start_r + V_r). The tree needs, per drafter row, the
top-k tokens by (log-prob desc, token id asc), the order `ddtree.tree.row_topk` documents, ties included, and
their log-probs. Each rank, in lockstep:

1. its logits [n, V_r] in float32 and their logsumexp [n]; one all-gather of the [n] logsumexps, reduced in
   rank order, gives every rank the same normalizer, so log-probs = logits - normalizer;
2. its shard's top-k in that order (`batch_row_topk`: ties inside the shard by id), ids made global;
3. one all-gather of [n, k, 2] float64 (value, id: a float32 and an id < 2^52 are exact in float64);
4. the merge: the global top-k lies in the union of the shards' top-k (a token outside its shard's top-k has k
   tokens before it in its own shard), and is picked from it in the same order (sort by id, then a stable
   sort by value desc), which is `row_topk` over the whole vocabulary.

Every rank merges the same gathered bits with the same ops, so every rank gets the same top-k, builds the same
trees and verifies the same tokens. The log-probs differ from a TP-1 `log_softmax` by float rounding only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ddtree.batch_tree import batch_row_topk

Gather = Callable[[Tensor], Tensor]  # local [*S] -> [tp, *S] in rank order, the same on every rank
PAD_ID = 2**52  # a shard smaller than k pads its candidates with (-inf, PAD_ID): after every real token


@dataclass(frozen=True)
class HeadShard:
    """This rank's rows of the target's LM head: the real vocabulary only (no padding, no added tokens)."""

    weight: Tensor  # [V_r, H]: row i = token start + i
    start: int  # global id of row 0
    vocab: int  # the whole real vocabulary, V = sum of V_r
    tp_size: int  # ranks sharing the head
    rank: int = 0  # this rank's index among them (rank 0 writes the DDTREE lines)
    group: Any = None  # SGLang's GroupCoordinator of those ranks (None at TP 1)


def head_shard(lm_head: Any) -> HeadShard | str:
    """The LM head's rows on this rank, or why the tree cannot be built from it.

    SGLang's ParallelLMHead always carries `shard_indices`, also at TP 1; its weight is padded, and padding rows
    must not become tree candidates. A plain nn.Linear head has no padding and is not sharded."""
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        return "the LM head is quantized (dense heads only)"
    tp = int(getattr(lm_head, "tp_size", 1))
    group = getattr(lm_head, "tp_group", None) if tp > 1 else None
    shard = getattr(lm_head, "shard_indices", None)
    if shard is None:
        if tp != 1:
            return "the LM head is sharded but has no shard indices"
        return HeadShard(weight=weight, start=0, vocab=int(weight.shape[0]), tp_size=1)
    if int(shard.num_added_elements) != 0:
        return "the LM head has an added vocabulary"
    start, rows = int(shard.org_vocab_start_index), int(shard.num_org_elements)
    if tp == 1:
        if start != 0:
            return "the LM head has an added vocabulary"
        return HeadShard(weight=weight[:rows], start=0, vocab=rows, tp_size=1)
    if group is None or int(getattr(group, "world_size", 0)) != tp:
        return f"the LM head is sharded over {tp} ranks without a matching tensor-parallel group"
    vocab = getattr(lm_head, "org_vocab_size", None)
    if not isinstance(vocab, int):
        return "the LM head does not say its vocabulary size"
    rank = int(group.rank_in_group)
    return HeadShard(weight=weight[:rows], start=start, vocab=vocab, tp_size=tp, rank=rank, group=group)


def group_gather(group: Any) -> Gather:
    """A `Gather` over SGLang's GroupCoordinator (`all_gather_into_tensor`, as DFLASH's own TP head uses)."""

    def gather(local: Tensor) -> Tensor:
        local = local.contiguous()
        out = torch.empty((group.world_size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device)
        group.all_gather_into_tensor(out, local)
        return out.view(group.world_size, *local.shape)

    return gather


def shard_logprobs(local_logits: Tensor, gather: Gather) -> Tensor:
    """This shard's log-probs [n, V_r] float32, normalized over the whole vocabulary (one gather of [n])."""
    logits = local_logits.float()
    normalizer = torch.logsumexp(gather(torch.logsumexp(logits, dim=-1)), dim=0)  # [tp, n] -> [n]
    return logits - normalizer[:, None]


def shard_topk(local_lp: Tensor, start: int, k: int, gather: Gather) -> tuple[Tensor, Tensor]:
    """The top-k over the whole vocabulary by (log-prob desc, token id asc) from this shard's log-probs
    local_lp [n, V_r] (tokens start .. start + V_r - 1); one gather of [n, k, 2]. -> ([n, k] f32, [n, k] i64)."""
    n, rows = local_lp.shape
    vals = torch.full((n, k), float("-inf"), dtype=torch.float32, device=local_lp.device)
    ids = torch.full((n, k), PAD_ID, dtype=torch.int64, device=local_lp.device)
    kk = min(k, rows)
    if kk:
        top_vals, top_ids = batch_row_topk(local_lp.float(), kk)
        vals[:, :kk], ids[:, :kk] = top_vals, top_ids + start
    every = gather(torch.stack([vals.double(), ids.double()], dim=-1))  # [tp, n, k, 2]
    return merge_topk(every, k)


def merge_topk(every: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The first k of the ranks' candidates every [tp, n, k', 2] (value, id) by (value desc, id asc)."""
    tp, n, width, _ = every.shape
    vals = every[..., 0].permute(1, 0, 2).reshape(n, tp * width).float()  # [n, tp * k']
    ids = every[..., 1].permute(1, 0, 2).reshape(n, tp * width).long()
    ids, perm = ids.sort(dim=-1, stable=True)  # canonical order: id asc, then a stable sort by value desc
    vals = vals.gather(1, perm)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices[:, :k]
    return vals.gather(1, order), ids.gather(1, order)


def head_topk(hidden: Tensor, head: HeadShard, k: int) -> tuple[Tensor, Tensor]:
    """The drafter's top-k per row from hidden [..., H] through a sharded head (TP > 1): two gathers over the
    head's group. -> (log-probs [..., k] float32, token ids [..., k] int64), the same on every rank."""
    lead = hidden.shape[:-1]
    with torch.inference_mode():
        logits = hidden.reshape(-1, hidden.shape[-1]).to(head.weight.dtype) @ head.weight.T  # [n, V_r]
        gather = group_gather(head.group)
        vals, ids = shard_topk(shard_logprobs(logits, gather), head.start, min(k, head.vocab), gather)
    return vals.view(*lead, -1), ids.view(*lead, -1)
