"""Tree masks under SGLang's target-verify CUDA graphs (triton attention backend).

SGLang 0.5.23 captures DFLASH's target-verify graphs *without* a custom mask on the backends that can run a
chain verify causally (`dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS`, which names TritonAttnBackend):
the captured attention kernel is causal over the verify window and never reads a mask. A tree verify replayed
from such a graph lets every node attend to every node before it in the flat order (its siblings and cousins,
not just its ancestors), which is wrong off the spine; on the H200 a chain re-verify disagreed with such a tree
verify at a logit gap of 0.349, which looked like rounding (docs/sglang.md, "CUDA graphs").

So a DDTREE tree server with CUDA graphs, on the triton backend:
1. has its target-verify graphs captured reading the backend's verify-mask buffer (`capture_with_tree_masks`,
   called from the worker's constructor: SGLang constructs the draft worker before it captures the target's
   graphs);
2. gives every verify that brings no mask the causal one (`mask_unmasked_verifies`): DFLASH's own chain rounds
   (sampling, log-prob and grammar batches, a self-check's fallback) and the self-check's chain re-verify,
   because the captured kernel now reads the buffer on every replay and would otherwise read the last tree's.

Other tree-mask backends (flashinfer) keep their graphs' own mask handling unverified: refused with graphs.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from ddtree.sglang.batch_round import full_mask_batched, full_mask_numel

# --attention-backend value -> the class SGLang's mask policy looks up by name
GRAPH_TREE_MASK_BACKENDS: dict[str, str] = {"triton": "TritonAttnBackend"}
SKIP_SET_NAME = "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"


def graph_backend_refusal(attention_backend: str | None) -> str:
    """Why a tree verify under CUDA graphs cannot run on this backend ("" when it can)."""
    if attention_backend in GRAPH_TREE_MASK_BACKENDS:
        return ""
    return (
        f"tree verify under CUDA graphs is verified only with --attention-backend "
        f"{', '.join(GRAPH_TREE_MASK_BACKENDS)} (got {attention_backend}); pass --disable-cuda-graph"
    )


def capture_with_tree_masks(dflash_utils: Any, attention_backend: str) -> frozenset[str]:
    """Take the backend's class out of SGLang's "capture DFLASH verify without a mask" set, so its
    target-verify graphs read the verify-mask buffer. Idempotent; ValueError when SGLang's set is gone.
    Returns the set with the class in, as SGLang captures DFLASH's own graphs (`causal_graphs.capture`)."""
    skip = getattr(dflash_utils, SKIP_SET_NAME, None)
    if not isinstance(skip, (set, frozenset)):
        raise ValueError(
            f"DDTREE: SGLang's {SKIP_SET_NAME} is missing, so its verify graphs' mask policy is unknown; "
            "pass --disable-cuda-graph"
        )
    name = GRAPH_TREE_MASK_BACKENDS[attention_backend]
    setattr(dflash_utils, SKIP_SET_NAME, frozenset(skip - {name}))
    return frozenset(skip | {name})


def captured_with_tree_masks(dflash_utils: Any, target_attn_backend: Any) -> bool:
    """After capture: SGLang's policy builds the mask for this backend, and the backend has its mask buffer."""
    _, build_mask = dflash_utils.resolve_dflash_verify_mask_policy(target_attn_backend)
    return bool(build_mask) and getattr(target_attn_backend, "verify_mask", None) is not None


def causal_full_mask(seq_lens: Tensor, width: int, numel: int) -> Tensor:
    """FULL_MASK of a chain verify of `width` tokens per request: prefix all True, the window lower-triangular.
    seq_lens: [bs] prefix lengths; numel: `full_mask_numel(sum(seq_lens), bs, width)` -> [numel] bool."""
    bs = int(seq_lens.shape[0])
    chain = torch.ones((width, width), dtype=torch.bool, device=seq_lens.device).tril()
    return full_mask_batched(chain.expand(bs, width, width), seq_lens, numel)


def mask_unmasked_verifies(attn_backend: Any) -> None:
    """Wrap the backend's out-of-graph metadata step (graph replays) so that a target verify without a custom
    mask gets the causal one; a tree verify's own mask and every other forward pass through unchanged."""
    original = attn_backend.init_forward_metadata_out_graph
    if getattr(original, "_ddtree_causal_default", False):
        return

    @functools.wraps(original)
    def with_causal_default(forward_batch: Any, in_capture: bool = False) -> Any:
        spec_info = forward_batch.spec_info
        unmasked_verify = (
            not in_capture
            and spec_info is not None
            and spec_info.custom_mask is None
            and forward_batch.forward_mode.is_target_verify()
        )
        if not unmasked_verify:
            return original(forward_batch, in_capture)
        seq_lens = forward_batch.seq_lens
        width = int(spec_info.draft_token_num)
        total = forward_batch.seq_lens_sum
        total = int(seq_lens.sum()) if total is None else int(total)  # None only in SGLang's gpu_only mode
        spec_info.custom_mask = causal_full_mask(seq_lens, width, full_mask_numel(total, len(seq_lens), width))
        try:
            return original(forward_batch, in_capture)
        finally:
            spec_info.custom_mask = None

    with_causal_default._ddtree_causal_default = True  # type: ignore[attr-defined]
    attn_backend.init_forward_metadata_out_graph = with_causal_default
