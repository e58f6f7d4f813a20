"""ddtree.sglang.tree_worker.dense_conv_windows: SGLang's CUDA layout for the verify's per-step conv windows
(deduplicated: step t's window is an overlapping view of a shared buffer, `mem_cache/memory_pool.py:598`) cannot
hold a tree's windows; the worker replaces it with a dense one. The layout is rebuilt here the way SGLang builds
it; the engine test (test_sglang_engine.py, patch P10) runs the hybrid tree on it end to end."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from ddtree.sglang.tree_round import dense_conv_windows

pytestmark = pytest.mark.runtime

LAYERS, SLOTS, STEPS, DIM, WIDTH = 2, 3, 8, 5, 4  # conv kernel 4: windows of K - 1 = 3 inputs


@dataclass(frozen=True, kw_only=True)
class SpeculativeState:  # the fields of SGLang's MambaPool.SpeculativeState the worker touches
    temporal: torch.Tensor
    intermediate_conv_window: list[torch.Tensor]


def chain_layout() -> torch.Tensor:
    """[layers, slots, steps, dim, K - 1] over a [layers, slots, dim, steps + K - 2] buffer, as SGLang's
    `_allocate_deduplicated_conv_window` lays it out (window axis last)."""
    phys = torch.zeros(LAYERS, SLOTS, DIM, STEPS + WIDTH - 2, dtype=torch.bfloat16)
    return phys.as_strided(
        (LAYERS, SLOTS, STEPS, DIM, WIDTH - 1), (phys.stride(0), phys.stride(1), phys.stride(3), phys.stride(2), 1)
    )


def tree_windows(buffer: torch.Tensor) -> None:
    """Two siblings (steps 1 and 2, children of the root at step 0) each store their own window."""
    buffer[0, 0, 1] = torch.tensor([1.0, 2.0, 3.0])  # (great-grandparent, grandparent..root, node 1)
    buffer[0, 0, 2] = torch.tensor([1.0, 2.0, 4.0])  # its sibling: same ancestors, its own input


def test_the_chain_layout_lets_a_sibling_overwrite_a_window() -> None:
    buffer = chain_layout()
    tree_windows(buffer)
    assert buffer[0, 0, 1, 0].tolist() != [1.0, 2.0, 3.0]  # node 1's window was clobbered by its sibling's


def test_dense_windows_replace_the_chain_layout_and_hold_tree_windows() -> None:
    temporal = torch.randn(LAYERS, SLOTS, 4)
    state = SpeculativeState(temporal=temporal, intermediate_conv_window=[chain_layout()])
    dense = dense_conv_windows(state)
    assert dense is not None
    (window,) = dense.intermediate_conv_window
    assert window.is_contiguous() and window.shape == (LAYERS, SLOTS, STEPS, DIM, WIDTH - 1)
    assert window.dtype == torch.bfloat16 and not window.any()
    assert dense.temporal is temporal  # everything else is the pool's own
    tree_windows(window)
    assert window[0, 0, 1, 0].tolist() == [1.0, 2.0, 3.0] and window[0, 0, 2, 0].tolist() == [1.0, 2.0, 4.0]


def test_dense_windows_are_left_alone() -> None:
    state = SpeculativeState(temporal=torch.zeros(1), intermediate_conv_window=[torch.zeros(1, 2, 8, 5, 3)])
    assert dense_conv_windows(state) is None
