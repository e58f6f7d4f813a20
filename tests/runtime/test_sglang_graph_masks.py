"""ddtree.sglang.graph_masks: the causal FULL_MASK for chain verifies, the replay wrapper that gives it to
verifies without a mask, the backend rule, and the capture policy switch (against SGLang 0.5.23's real
dflash_utils in test_sglang_plugin.py's contract probe, which imports SGLang once for all its checks)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ddtree.sglang.batch_round import full_mask_numel
from ddtree.sglang.graph_masks import (
    capture_with_tree_masks,
    causal_full_mask,
    graph_backend_refusal,
    mask_unmasked_verifies,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

pytestmark = pytest.mark.runtime


def chain_mask_by_hand(prefix_lens: list[int], width: int) -> Tensor:
    """Row i of request b sees the prefix and window tokens 0..i: written out element by element."""
    out: list[bool] = []
    for plen in prefix_lens:
        for i in range(width):
            out += [True] * plen + [j <= i for j in range(width)]
    return torch.tensor(out, dtype=torch.bool)


@settings(max_examples=60, deadline=None)
@given(prefix_lens=st.lists(st.integers(0, 40), min_size=1, max_size=6), width=st.integers(1, 16))
def test_causal_full_mask_is_prefix_then_lower_triangle(prefix_lens: list[int], width: int) -> None:
    seq = torch.tensor(prefix_lens, dtype=torch.int64)
    got = causal_full_mask(seq, width, full_mask_numel(sum(prefix_lens), len(prefix_lens), width))
    assert torch.equal(got, chain_mask_by_hand(prefix_lens, width))


class ForwardMode:
    def __init__(self, verify: bool) -> None:
        self.verify = verify

    def is_target_verify(self) -> bool:
        return self.verify


class RecordingBackend:
    """Stands in for the triton backend's out-of-graph step: records the mask each call saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[Tensor | None, bool]] = []

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        mask = forward_batch.spec_info.custom_mask if forward_batch.spec_info is not None else None
        self.seen.append((None if mask is None else mask.clone(), in_capture))


def verify_batch(prefix_lens: list[int], width: int, mask: Tensor | None, verify: bool = True, total: bool = True):
    seq = torch.tensor(prefix_lens, dtype=torch.int64)
    return SimpleNamespace(
        forward_mode=ForwardMode(verify),
        seq_lens=seq,
        seq_lens_sum=sum(prefix_lens) if total else None,
        spec_info=SimpleNamespace(custom_mask=mask, draft_token_num=width),
    )


def test_a_replayed_chain_verify_gets_the_causal_mask_and_the_caller_keeps_none() -> None:
    backend = RecordingBackend()
    mask_unmasked_verifies(backend)
    for total in (True, False):  # seq_lens_sum given (the usual replay view) or None (gpu_only: summed on device)
        batch = verify_batch([5, 0, 12], 8, None, total=total)
        backend.init_forward_metadata_out_graph(batch)
        mask, in_capture = backend.seen[-1]
        assert mask is not None and not in_capture
        assert torch.equal(mask, chain_mask_by_hand([5, 0, 12], 8))
        assert batch.spec_info.custom_mask is None  # put back: DFLASH's verify input is not changed


def test_a_tree_mask_capture_and_other_forwards_pass_through_unchanged() -> None:
    backend = RecordingBackend()
    mask_unmasked_verifies(backend)
    tree = torch.rand(full_mask_numel(9, 2, 4)) > 0.5
    backend.init_forward_metadata_out_graph(verify_batch([4, 5], 4, tree))
    assert torch.equal(backend.seen[-1][0], tree)
    backend.init_forward_metadata_out_graph(verify_batch([4, 5], 4, None), in_capture=True)
    assert backend.seen[-1] == (None, True)
    backend.init_forward_metadata_out_graph(verify_batch([4, 5], 4, None, verify=False))
    assert backend.seen[-1] == (None, False)
    decode = SimpleNamespace(forward_mode=ForwardMode(False), spec_info=None)
    backend.init_forward_metadata_out_graph(decode)
    assert backend.seen[-1] == (None, False)


def test_wrapping_twice_wraps_once() -> None:
    backend = RecordingBackend()
    mask_unmasked_verifies(backend)
    first = backend.init_forward_metadata_out_graph
    mask_unmasked_verifies(backend)
    assert backend.init_forward_metadata_out_graph is first
    backend.init_forward_metadata_out_graph(verify_batch([3], 2, None))
    assert len(backend.seen) == 1


def test_only_triton_takes_tree_masks_under_graphs() -> None:
    assert graph_backend_refusal("triton") == ""
    for other in ("flashinfer", "fa3", None):
        why = graph_backend_refusal(other)
        assert "--disable-cuda-graph" in why and str(other) in why and "\n" not in why


def test_the_capture_switch_needs_sglangs_set() -> None:
    module = SimpleNamespace(_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS=frozenset({"TritonAttnBackend", "Other"}))
    causal = capture_with_tree_masks(module, "triton")
    assert capture_with_tree_masks(module, "triton") == causal  # idempotent
    assert frozenset({"Other"}) == module._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS
    assert causal == frozenset({"TritonAttnBackend", "Other"})  # SGLang's own set, for DFLASH's causal graphs
    with pytest.raises(ValueError, match="pass --disable-cuda-graph"):
        capture_with_tree_masks(SimpleNamespace(), "triton")
