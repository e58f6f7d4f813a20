"""The DDTREE `shadow` worker's side path, without SGLang (the worker class, which imports SGLang, is
`ddtree.sglang.shadow_worker.DDTreeShadowWorker`; the `tree` worker is in tree_worker.py).

The shadow worker IS SGLang's DFlashWorkerV2: every round (draft block, chain verify, accept, KV commit,
hidden states back to the drafter) runs unchanged, so its tokens are DFLASH's by construction. On the side,
it reads the drafter's per-position distributions from the same hidden states DFLASH's eager head argmaxes,
builds the DDTree tree with `ddtree.tree.build_tree`, and logs the DDTREE lines (tree shape, build time, the
accepted length of the real chain verify). Any failure in that side path disables it with one WARNING; it
never changes a token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.batch_tree import build_trees_from_topk
from ddtree.config import DDTreeConfig
from ddtree.sglang.vocab_parallel import HeadShard, head_topk
from ddtree.tree import TreeShape, build_tree, tree_shape


@dataclass(frozen=True)
class DraftObservation:
    """The trees one draft step would have built, one per request."""

    nodes: list[int]  # drafted nodes per request (root excluded)
    depth: list[int]
    width: list[int]
    spine_matches: bool  # the trees' spines equal DFLASH's drafted tokens
    build_ms: float

    @property
    def shapes(self) -> list[TreeShape]:
        return [TreeShape(n, d, w) for n, d, w in zip(self.nodes, self.depth, self.width, strict=True)]

    def round_times(self, round_ms: float) -> dict[str, float]:
        """The round's phase times (`ddtree.stats.round_stats`): SGLang's draft and verify run inside one
        DFLASH round, reported together as verify; the tree's build on the side as build."""
        return {"build": self.build_ms, "verify": max(round_ms - self.build_ms, 0.0)}


def observe_draft(
    hidden_states: Tensor, head_weight: Tensor, dflash_tokens: Tensor, block_size: int, config: DDTreeConfig
) -> DraftObservation:
    """Build the DDTree trees for one DFLASH draft step.

    hidden_states: [bs * (block_size - 1), H] the drafter's hidden states DFLASH feeds its head;
    head_weight: [V, H] the (unsharded) LM head; dflash_tokens: [bs * (block_size - 1)] DFLASH's argmax.
    """
    rows = block_size - 1
    t0 = time.perf_counter()
    logits = hidden_states.to(head_weight.dtype) @ head_weight.T  # [bs * rows, V]
    logprobs = torch.log_softmax(logits.float(), dim=-1).view(-1, rows, logits.shape[-1])  # [bs, rows, V]
    spine = logprobs.argmax(dim=-1)  # [bs, rows]
    nodes, depth, width = [], [], []
    for lp in logprobs:  # lp: [rows, V]
        shape = tree_shape(build_tree(lp, root_token=0, budget=config.budget, topk=config.topk))
        nodes.append(shape.nodes)
        depth.append(shape.depth)
        width.append(shape.width)
    build_ms = (time.perf_counter() - t0) * 1000.0
    matches = bool(torch.equal(spine.reshape(-1).to(dflash_tokens.device), dflash_tokens.reshape(-1)))
    return DraftObservation(nodes=nodes, depth=depth, width=width, spine_matches=matches, build_ms=build_ms)


def observe_draft_sharded(
    hidden_states: Tensor, head: HeadShard, dflash_tokens: Tensor, block_size: int, config: DDTreeConfig
) -> DraftObservation:
    """`observe_draft` through a vocab-parallel head (TP > 1). Every rank runs it in lockstep: the two gathers
    over the head's group come first, so anything that fails after them fails the same way on every rank."""
    rows = block_size - 1
    t0 = time.perf_counter()
    vals, ids = head_topk(hidden_states.view(-1, rows, hidden_states.shape[-1]), head, config.topk)  # [bs, rows, k]
    bs = int(vals.shape[0])
    roots = torch.zeros(bs, dtype=torch.int64, device=vals.device)
    trees = build_trees_from_topk(vals, ids, roots, config.budget)
    shapes = [tree_shape(trees.tree(b)) for b in range(bs)]
    build_ms = (time.perf_counter() - t0) * 1000.0
    spine = ids[:, :, 0].reshape(-1).to(dflash_tokens.device)  # [bs * rows]: each row's best token
    return DraftObservation(
        nodes=[s.nodes for s in shapes],
        depth=[s.depth for s in shapes],
        width=[s.width for s in shapes],
        spine_matches=bool(torch.equal(spine, dflash_tokens.reshape(-1))),
        build_ms=build_ms,
    )
