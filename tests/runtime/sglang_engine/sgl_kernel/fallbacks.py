"""Pure-torch versions of the three CPU `sgl_kernel` ops SGLang 0.5.23's engine calls here (baseline, DFLASH,
DDTREE shadow on a dense Qwen3, page size 1). Each mirrors the GPU Triton kernel named in its docstring; they are
slow Python loops, fine for a handful of tiny requests."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import torch

PROVIDED = frozenset({"copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu", "assign_extend_cache_locs_cpu"})


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """`sglang/kernels/ops/kvcache/cache_move.py` (`copy_all_layer_kv_cache_tiled`): in every KV buffer b (base
    address `data_ptrs[b]`, row stride `strides[b]` bytes), row `tgt_loc[i]` := row `src_loc[i]`; all rows of a
    buffer are read before any is written (the kernel's semantics when the sets overlap)."""
    targets = [int(t) for t in tgt_loc.tolist()]
    sources = [int(s) for s in src_loc.tolist()]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        base, stride = int(base), int(stride)
        rows = [ctypes.string_at(base + row * stride, stride) for row in sources]
        for target, row_bytes in zip(targets, rows, strict=True):
            ctypes.memmove(base + target * stride, row_bytes, stride)


def _packed_spans(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> Iterator[tuple[int, int, int, slice]]:
    """Per request with a non-empty span: (row, start, end, its slice of the packed `out_cache_loc`), the
    packed entries following each other in request order (both Triton kernels' layout)."""
    offset = 0
    for req, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = int(end) - int(start)
        if n > 0:
            yield int(req), int(start), int(end), slice(offset, offset + n)
            offset += n


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """`sglang/srt/mem_cache/allocation.py` (`assign_req_to_token_pool`): for request i,
    `req_to_token[req_pool_indices[i], start[i]:end[i]]` = the next `end[i] - start[i]` entries of the packed
    `out_cache_loc`."""
    for req, start, end, packed in _packed_spans(req_pool_indices, start_offset, end_offset):
        req_to_token[req, start:end] = out_cache_loc[packed].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """`sglang/kernels/ops/speculative/cache_locs.py` (`assign_extend_cache_locs`): the inverse gather, packed
    `out_cache_loc` := `req_to_token[req_pool_indices[i], start[i]:end[i]]` for each request in turn."""
    for req, start, end, packed in _packed_spans(req_pool_indices, start_offset, end_offset):
        out_cache_loc[packed] = req_to_token[req, start:end].to(out_cache_loc.dtype)
