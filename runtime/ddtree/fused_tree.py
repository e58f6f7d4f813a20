"""The batched DDTree build in two Triton launches plus a tie-exact top-k in two, instead of ~90 small torch ops:
the same `BatchTrees` as `ddtree.batch_tree.build_trees_batched` (and so `build_tree_heap`), ids and ties
included (tests/runtime/test_fused_tree.py; on a GPU, runtime/bench/round_bench.py checks it too).

1. `row_topk_fused`: per row the top-k by (log-prob desc, token id asc). Stage one, one program per (row, 4096
   token chunk): k rounds of (max, smallest id at the max) in registers; stage two, one program per row, the
   same over the chunks' candidates. One read of the log-probs, no sort, no tie scan: exact under ties by
   construction. (`torch.topk` at vocabulary 248320 costs 0.15 ms for 15 rows and 2.1 ms for 720 on an H200.)
2. `build_trees_fused`: one program per request runs `ddtree.tree.expand_best_first` itself: pop the best
   candidate by (score desc, depth asc, parent id asc, rank asc), push its first child and next sibling, the
   candidates in registers, float32 scores `parent + log-prob` as the reference adds them.

CUDA only (and Triton's interpreter for tests on a CPU, asked for explicitly); `fused_available` says where.
Static shapes and no host sync, so the build can be captured in a CUDA graph. `DDTREE_FUSED_BUILD=0` turns it
off (`ddtree.sglang.batch_round.plan_batch` then builds with `build_trees_batched`).
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

import torch
from torch import Tensor

from ddtree.batch_tree import BatchTrees, check_tree_inputs, level_sizes
from ddtree.config import FusedBuild, process_config, triton_interpreted

CHUNK = 4096  # vocabulary tokens per stage-one program
MAX_TOPK = 32  # larger top-k: the unrolled extraction gets long; build_trees_batched is used instead


@lru_cache(maxsize=1)
def kernels() -> ModuleType | None:
    """ddtree._triton_tree, or None without triton."""
    try:
        from ddtree import _triton_tree
    except ImportError:  # no triton
        return None
    return _triton_tree


def fused_available(device: torch.device, topk: int, setting: FusedBuild | None = None) -> bool:
    """The fused build runs here: on a CUDA device unless the setting is OFF; on a CPU only under Triton's
    interpreter and when asked for (`TRITON_INTERPRET=1` and ON: the parity tests; the CPU engine tests, which
    interpret SGLang's own kernels, keep the torch planner); triton importable; topk small. `setting`: the
    worker's `DDTreeConfig.fused_build`, else this process's (`ddtree.config.process_config`, read once)."""
    setting = process_config().fused_build if setting is None else setting
    if setting is FusedBuild.OFF or topk > MAX_TOPK:
        return False
    interpreted = setting is FusedBuild.ON and triton_interpreted()
    return (device.type == "cuda" or interpreted) and kernels() is not None


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def row_topk_fused(lp: Tensor, depth_rows: int, k: int) -> tuple[Tensor, Tensor]:
    """Top-k of rows 0 .. depth_rows - 1 of every request: lp [bs, R, V] float32 (last dim contiguous) ->
    (values [bs, depth_rows, k] float32, token ids [bs, depth_rows, k] int64), by (value desc, id asc)."""
    mod = kernels()
    if mod is None:
        raise RuntimeError("triton is not importable")
    bs, _, vocab = lp.shape
    if lp.dtype != torch.float32 or lp.stride(2) != 1:
        lp = lp.float().contiguous()
    n_rows = bs * depth_rows
    n_chunks = -(-vocab // CHUNK)
    cand_val = torch.empty((n_rows, n_chunks, k), dtype=torch.float32, device=lp.device)
    cand_id = torch.empty((n_rows, n_chunks, k), dtype=torch.int64, device=lp.device)
    mod.chunk_topk_kernel[(n_rows, n_chunks)](
        lp, cand_val, cand_id, depth_rows, vocab, lp.stride(0), lp.stride(1), n_chunks, K=k, CHUNK=CHUNK,
        num_warps=8,
    )  # fmt: skip
    vals = torch.empty((bs, depth_rows, k), dtype=torch.float32, device=lp.device)
    ids = torch.empty((bs, depth_rows, k), dtype=torch.int64, device=lp.device)
    n_cand = n_chunks * k
    mod.merge_topk_kernel[(n_rows,)](cand_val, cand_id, vals, ids, n_cand, vocab, K=k, BLOCK=_pow2(n_cand), num_warps=4)
    return vals, ids


def build_trees_fused(draft_logprobs: Tensor, root_tokens: Tensor, budget: int, topk: int) -> BatchTrees:
    """`build_trees_batched(draft_logprobs [bs, R, V], root_tokens [bs], budget, topk)` in four launches."""
    check_tree_inputs(draft_logprobs, root_tokens, budget, topk)
    bs, n_rows, vocab = draft_logprobs.shape
    device = draft_logprobs.device
    sizes = level_sizes(n_rows, budget, topk, vocab)
    roots = root_tokens.to(device=device, dtype=torch.int64)
    if not sizes:  # budget 0 or no rows: the root alone
        zero = torch.zeros((bs, 1), dtype=torch.int64, device=device)
        return BatchTrees(roots.view(bs, 1), zero - 1, zero, torch.zeros((bs, 1), device=device))
    k = min(topk, vocab)
    depth_rows = len(sizes)
    vals, ids = row_topk_fused(draft_logprobs.detach(), depth_rows, k)
    n = 1 + min(budget, sum(sizes))
    tokens = torch.empty((bs, n), dtype=torch.int64, device=device)
    parents = torch.empty((bs, n), dtype=torch.int64, device=device)
    depths = torch.empty((bs, n), dtype=torch.int64, device=device)
    scores = torch.empty((bs, n), dtype=torch.float32, device=device)
    kernels().expand_kernel[(bs,)](  # type: ignore[union-attr]
        vals, ids, roots.contiguous(), tokens, parents, depths, scores, depth_rows, N=n, K=k, CAP=_pow2(n + 1),
        num_warps=1,
    )  # fmt: skip
    return BatchTrees(tokens=tokens, parents=parents, depths=depths, scores=scores)
