"""The hybrid (Gated DeltaNet + attention) tree verify replayed from SGLang's target-verify CUDA graphs.

SGLang 0.5.23's GDN backend (`MambaAttnBackendBase`, hybrid_linear_attn_backend.py) takes its tree path, the
conv window from each node's ancestors and the recurrent state from its parent, only when its `topk` (the
server-wide EAGLE top-k, which DFLASH leaves at 0) is above 1. Its graph state already has what a tree needs,
whatever the top-k: `init_cuda_graph_state` allocates static `retrieve_next_token` / `retrieve_next_sibling` /
`retrieve_parent_token` buffers per batch size ([bs, draft_token_num] int32), and `_replay_metadata` hands
them to the forward when `topk > 1`, copying the verify's links into the first rows when its spec_info has
them. So a DDTREE hybrid server with graphs:

1. raises the backend's `topk` around every target-verify metadata step, the capture's included
   (`replay_tree_links`, installed before SGLang captures the target's graphs): the graphs are captured with
   the tree kernels reading the static buffers, so every verify, chain or tree, replays them;
2. fills those buffers whole before each replay (`fill_verify_links`): the tree's links, or a chain's for a
   verify that brings none (DFLASH's own rounds, a self-check's chain re-verify), and chain rows for the padding
   up to the graph's batch size. SGLang's own copy would leave a chain verify replaying the previous tree's
   links (its parent links are derived from these buffers inside the graph), and eager verifies stay chains:
   the backend's `topk` is back to DFLASH's outside these calls.

The dense per-step conv windows (`tree_worker.dense_conv_windows`) must be in the pool before the
capture too: a graph keeps the buffers it was captured with.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

TREE_TOPK = 2  # any value > 1 selects the GDN backend's tree path


def chain_links(bs: int, width: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """SGLang's tree links of `bs` chains of `width` tokens: next_token [bs, W] = slot + 1 (-1 at the last),
    next_sibling [bs, W] all -1 (int32)."""
    steps = torch.arange(1, width + 1, dtype=torch.int32, device=device)
    next_token = torch.where(steps < width, steps, torch.full_like(steps, -1)).expand(bs, width).clone()
    return next_token, torch.full((bs, width), -1, dtype=torch.int32, device=device)


def fill_verify_links(
    static_next: Tensor, static_sibling: Tensor, next_token: Tensor | None, next_sibling: Tensor | None
) -> None:
    """Overwrite a graph's static links [graph_bs, W] in place: rows 0 .. n - 1 the verify's own links [n, W]
    (a tree's), or a chain's when it has none; rows n .. graph_bs - 1 (padding) a chain's."""
    graph_bs, width = static_next.shape
    n = 0
    if next_token is not None:
        if next_sibling is None or next_token.shape != next_sibling.shape or next_token.shape[1] != width:
            raise ValueError(f"tree links {tuple(next_token.shape)} do not fit the graph's [{graph_bs}, {width}]")
        n = int(next_token.shape[0])
        if n > graph_bs:
            raise ValueError(f"{n} requests' tree links do not fit a graph of batch size {graph_bs}")
        static_next[:n].copy_(next_token)
        static_sibling[:n].copy_(next_sibling)
    chain_next, chain_sibling = chain_links(graph_bs - n, width, static_next.device)
    static_next[n:].copy_(chain_next)
    static_sibling[n:].copy_(chain_sibling)


@dataclass
class TreeLinks:
    """What the wrapper saw: target-verify graphs captured on the tree path, replays whose links it filled."""

    captures: int = 0
    replays: int = 0


def tree_links(attn_backend: Any) -> TreeLinks | None:
    """The wrapper's counters on this backend, None when `replay_tree_links` did not wrap it."""
    state = getattr(attn_backend.init_forward_metadata_out_graph, "_ddtree_tree_links", None)
    return state if isinstance(state, TreeLinks) else None


def replay_tree_links(attn_backend: Any, linear_backend: Any) -> TreeLinks:
    """Wrap the target's out-of-graph metadata step (graph capture and replays): a target verify runs it with
    the GDN backend's top-k raised, then its static links are filled (`fill_verify_links`). Idempotent."""
    original = attn_backend.init_forward_metadata_out_graph
    existing = tree_links(attn_backend)
    if existing is not None:
        return existing
    state = TreeLinks()

    @functools.wraps(original)
    def with_tree_links(forward_batch: Any, in_capture: bool = False) -> Any:
        if not forward_batch.forward_mode.is_target_verify():
            return original(forward_batch, in_capture)
        topk = linear_backend.topk
        linear_backend.topk = max(TREE_TOPK, int(topk or 0))
        try:
            result = original(forward_batch, in_capture)
        finally:
            linear_backend.topk = topk
        metadata = linear_backend.forward_metadata
        if metadata.retrieve_next_token is None or metadata.retrieve_parent_token is None:
            raise RuntimeError("DDTREE: SGLang's GDN backend handed its graph no tree links (its replay changed)")
        spec_info = forward_batch.spec_info
        fill_verify_links(
            metadata.retrieve_next_token,
            metadata.retrieve_next_sibling,
            getattr(spec_info, "retrieve_next_token", None),
            getattr(spec_info, "retrieve_next_sibling", None),
        )
        if in_capture:
            state.captures += 1
        else:
            state.replays += 1
        return result

    with_tree_links._ddtree_tree_links = state  # type: ignore[attr-defined]
    attn_backend.init_forward_metadata_out_graph = with_tree_links
    return state
