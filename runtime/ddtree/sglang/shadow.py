"""The DDTREE `shadow` worker for SGLang (the `tree` worker is in tree_worker.py).

The shadow worker IS SGLang's DFlashWorkerV2: every round (draft block, chain verify, accept, KV commit,
hidden states back to the drafter) runs unchanged, so its tokens are DFLASH's by construction. On the side,
it reads the drafter's per-position distributions from the same hidden states DFLASH's eager head argmaxes,
builds the DDTree tree with `ddtree.tree.build_tree`, and logs the DDTREE lines (tree shape, build time, the
accepted length of the real chain verify). Any failure in that side path disables it with one WARNING; it
never changes a token.

sglang is imported only inside `shadow_worker_class()`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ddtree.batch_tree import build_trees_from_topk
from ddtree.config import DDTreeConfig
from ddtree.metrics import MetricsLog, RoundStats
from ddtree.sglang.vocab_parallel import HeadShard, head_shard, head_topk
from ddtree.tree import build_tree, tree_shape

logger = logging.getLogger("ddtree")


@dataclass(frozen=True)
class DraftObservation:
    """The trees one draft step would have built, one per request."""

    nodes: list[int]  # drafted nodes per request (root excluded)
    depth: list[int]
    width: list[int]
    spine_matches: bool  # the trees' spines equal DFLASH's drafted tokens
    build_ms: float


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


def round_stats(obs: DraftObservation, accept_lens: list[int], round_ms: float) -> list[RoundStats]:
    """One RoundStats per request: the chain's accepted length (bonus included), the tree's shape. SGLang's
    draft and verify run inside one DFLASH round, reported together as verify_ms."""
    verify_ms = max(round_ms - obs.build_ms, 0.0)
    return [
        RoundStats(
            accepted_len=acc,
            nodes=n,
            depth=d,
            off_spine=False,  # shadow verifies the spine only
            draft_ms=0.0,
            build_ms=obs.build_ms / len(accept_lens),
            verify_ms=verify_ms / len(accept_lens),
            commit_ms=0.0,
            width=w,
        )
        for acc, n, d, w in zip(accept_lens, obs.nodes, obs.depth, obs.width, strict=True)
    ]


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


def shadow_worker_class() -> type:
    """DFlashWorkerV2 plus DDTree statistics; built lazily because the base class lives in sglang."""
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from ddtree.sglang.compat import attribute_refusal
    from ddtree.sglang.gates import hybrid_mode

    class DDTreeShadowWorker(DFlashWorkerV2):  # type: ignore[misc]
        def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
            refusal = attribute_refusal(self)
            if refusal:
                raise ValueError(refusal)
            self._ddtree_config = DDTreeConfig.from_env(os.environ)
            is_hybrid = mambaish_config(target_worker.model_runner.model_config) is not None
            hybrid = hybrid_mode(self._ddtree_config, is_hybrid=is_hybrid, exact_tree_path=False)
            for name in ("selector", "lilicorr"):
                if getattr(self, name, None) is not None:
                    raise ValueError(f"DDTREE: DFLASH drafts with a {name} head are not supported")
            if getattr(self, "_is_domino", False):
                raise ValueError("DDTREE: Domino DFLASH drafts are not supported")
            head = head_shard(getattr(target_worker.model_runner.model, "lm_head", None))
            self._ddtree_rank = head.rank if isinstance(head, HeadShard) else 0  # rank 0 writes the DDTREE lines
            self._ddtree_log = MetricsLog(self._ddtree_config, int(self.block_size), hybrid)
            if self._ddtree_rank == 0:
                self._ddtree_log.start()
            self._ddtree_obs: DraftObservation | None = None
            self._ddtree_enabled = True

        def _ddtree_disable(self, why: str) -> None:
            if self._ddtree_enabled:
                logger.warning("DDTREE shadow statistics disabled: %s (tokens are unaffected)", why)
            self._ddtree_enabled = False

        def _greedy_sample_from_vocab_parallel_head(
            self, *, hidden_states: Tensor, lm_head: Any, chunk_size: int = 256
        ) -> Tensor:
            tokens: Tensor = super()._greedy_sample_from_vocab_parallel_head(
                hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size
            )
            if self._ddtree_enabled:
                head = head_shard(lm_head)
                if isinstance(head, str):
                    self._ddtree_disable(head)
                else:
                    try:
                        block, config = int(self.block_size), self._ddtree_config
                        if head.tp_size == 1:
                            obs = observe_draft(hidden_states, head.weight, tokens, block, config)
                        else:  # every rank, in lockstep: DFLASH's own head above gathers the same way
                            obs = observe_draft_sharded(hidden_states, head, tokens, block, config)
                        self._ddtree_obs = obs
                        if not self._ddtree_obs.spine_matches:
                            logger.warning("DDTREE shadow: a tree spine differs from DFLASH's draft this round")
                    except Exception as err:  # a statistics failure must never reach the round
                        self._ddtree_disable(f"{type(err).__name__}: {err}")
            return tokens

        def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._ddtree_obs = None
            t0 = time.perf_counter()
            result = super().forward_batch_generation(batch, *args, **kwargs)
            obs, self._ddtree_obs = self._ddtree_obs, None
            accept_lens = getattr(result, "accept_lens", None)
            if obs is not None and self._ddtree_enabled and self._ddtree_rank == 0 and isinstance(accept_lens, Tensor):
                lens = accept_lens.tolist()
                if len(lens) == len(obs.nodes):
                    for stats in round_stats(obs, lens, (time.perf_counter() - t0) * 1000.0):
                        self._ddtree_log.record(stats)
            return result

    return DDTreeShadowWorker
