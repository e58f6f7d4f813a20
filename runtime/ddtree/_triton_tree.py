"""Triton kernels of `ddtree.fused_tree` (imported only through it: this module needs triton at import)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_topk_kernel(
    lp_ptr,  # float32 [bs, R, V] (rows b, d at b * stride_b + d * stride_r)
    out_val_ptr,  # float32 [n_rows, n_chunks, K]
    out_id_ptr,  # int64 [n_rows, n_chunks, K]; V = none
    depth_rows,
    vocab,
    stride_b,
    stride_r,
    n_chunks,
    K: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Stage 1: the top K of one vocabulary chunk of one row, by (value desc, id asc)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // depth_rows
    d = row % depth_rows
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = cols < vocab
    x = tl.load(lp_ptr + b.to(tl.int64) * stride_b + d.to(tl.int64) * stride_r + cols, mask=inside, other=0.0)
    alive = inside
    out = (row.to(tl.int64) * n_chunks + chunk) * K
    for j in tl.static_range(K):
        m = tl.max(tl.where(alive, x, float("-inf")), axis=0)
        pick = tl.min(tl.where(alive & (x == m), cols, vocab), axis=0)
        tl.store(out_val_ptr + out + j, m)
        tl.store(out_id_ptr + out + j, pick.to(tl.int64))
        alive = alive & (cols != pick)


@triton.jit
def merge_topk_kernel(
    cand_val_ptr,  # float32 [n_rows, n_chunks * K]
    cand_id_ptr,  # int64 [n_rows, n_chunks * K]; vocab = none
    val_ptr,  # float32 [n_rows, K]
    id_ptr,  # int64 [n_rows, K]
    n_cand,
    vocab,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Stage 2: a row's top K over its chunks' candidates, by (value desc, id asc)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    inside = offs < n_cand
    x = tl.load(cand_val_ptr + row * n_cand + offs, mask=inside, other=0.0)
    ids = tl.load(cand_id_ptr + row * n_cand + offs, mask=inside, other=vocab)
    alive = inside & (ids < vocab)
    for j in tl.static_range(K):
        m = tl.max(tl.where(alive, x, float("-inf")), axis=0)
        pick = tl.min(tl.where(alive & (x == m), ids, vocab), axis=0)
        tl.store(val_ptr + row * K + j, m)
        tl.store(id_ptr + row * K + j, pick)
        alive = alive & (ids != pick)


@triton.jit
def expand_kernel(
    val_ptr,  # float32 [bs, R, K] per-row top-k values, best first
    id_ptr,  # int64 [bs, R, K] their token ids
    root_ptr,  # int64 [bs]
    tok_ptr,  # int64 [bs, N] out
    par_ptr,  # int64 [bs, N] out
    dep_ptr,  # int64 [bs, N] out
    score_ptr,  # float32 [bs, N] out
    depth_rows,
    N: tl.constexpr,  # nodes per tree, root included
    K: tl.constexpr,
    CAP: tl.constexpr,  # candidate slots (power of 2, >= N + 1)
):
    """One request's best-first expansion (`ddtree.tree.expand_best_first`): pop the best candidate by
    (score desc, depth asc, parent id asc, rank asc), give it the next id, push its first child and its next
    sibling. Candidates live in CAP register slots; the popped slot becomes its next sibling."""
    b = tl.program_id(0).to(tl.int64)
    rows = b * depth_rows * K
    slot = tl.arange(0, CAP)
    big = 1 << 30
    root = tl.load(root_ptr + b)
    tl.store(tok_ptr + b * N, root)
    tl.store(par_ptr + b * N, -1)
    tl.store(dep_ptr + b * N, 0)
    tl.store(score_ptr + b * N, 0.0)
    first = tl.load(val_ptr + rows)  # the root's first child: row 0, rank 0
    c_valid = slot == 0
    c_score = tl.where(c_valid, first, float("-inf"))
    c_pscore = tl.zeros([CAP], dtype=tl.float32)
    c_depth = tl.where(c_valid, 1, big)
    c_parent = tl.zeros([CAP], dtype=tl.int32)
    c_rank = tl.zeros([CAP], dtype=tl.int32)
    for i in range(1, N):
        best = tl.max(tl.where(c_valid, c_score, float("-inf")), axis=0)
        m = c_valid & (c_score == best)
        dep = tl.min(tl.where(m, c_depth, big), axis=0)
        m = m & (c_depth == dep)
        par = tl.min(tl.where(m, c_parent, big), axis=0)
        m = m & (c_parent == par)
        rank = tl.min(tl.where(m, c_rank, big), axis=0)
        sel = m & (c_rank == rank)
        pscore = tl.sum(tl.where(sel, c_pscore, 0.0), axis=0)
        row = dep - 1
        tl.store(tok_ptr + b * N + i, tl.load(id_ptr + rows + row * K + rank))
        tl.store(par_ptr + b * N + i, par.to(tl.int64))
        tl.store(dep_ptr + b * N + i, dep.to(tl.int64))
        tl.store(score_ptr + b * N + i, best)
        # the popped slot becomes its next sibling (same parent, rank + 1), if there is one
        has_sib = rank + 1 < K
        sib_val = tl.load(val_ptr + rows + row * K + rank + 1, mask=has_sib, other=0.0)
        c_score = tl.where(sel, pscore + sib_val, c_score)
        c_rank = tl.where(sel, rank + 1, c_rank)
        c_valid = c_valid & ~(sel & ~has_sib)
        # its first child (row dep, rank 0) goes to the first free slot, if that row exists
        has_child = dep < depth_rows
        free = tl.min(tl.where(c_valid, CAP, slot), axis=0)
        put = (slot == free) & has_child
        child_val = tl.load(val_ptr + rows + dep * K, mask=has_child, other=0.0)
        c_score = tl.where(put, best + child_val, c_score)
        c_pscore = tl.where(put, best, c_pscore)
        c_depth = tl.where(put, dep + 1, c_depth)
        c_parent = tl.where(put, i, c_parent)
        c_rank = tl.where(put, 0, c_rank)
        c_valid = c_valid | put


@triton.jit
def _take(vec, idx, ids):
    """vec[idx] for a register vector (idx out of range: 0): a one-hot reduction over [NP, NP]."""
    return tl.sum(tl.where(ids[None, :] == idx[:, None], vec[None, :], 0), axis=1)


@triton.jit
def layout_kernel(
    tok_ptr,  # int64 [bs, N] tree in pop order (BatchTrees)
    par_ptr,  # int64 [bs, N]
    dep_ptr,  # int64 [bs, N]
    prefix_ptr,  # int64 [bs]
    order_ptr,  # int64 [bs, N] out: node id per slot
    tokens_ptr,  # int64 [bs, S] out
    parents_ptr,  # int64 [bs, S] out: parent slot (-1 root; padding 0)
    depths_ptr,  # int64 [bs, S] out (padding 1)
    positions_ptr,  # int64 [bs, S] out: prefix + depth
    mask_ptr,  # int8 [bs, S, S] out: slot c is slot a or an ancestor of it (padding: itself and the root)
    index_ptr,  # int64 [bs, S] out: b * S + slot
    next_token_ptr,  # int64 [bs, S] out
    next_sibling_ptr,  # int64 [bs, S] out
    depth_ptr,  # int64 [bs] out
    width_ptr,  # int64 [bs] out
    N: tl.constexpr,
    S: tl.constexpr,
    NP: tl.constexpr,  # power of 2 >= S
    MAXD: tl.constexpr,  # deepest possible node
):
    """`ddtree.sglang.batch_round.layout_batch` for one request: SGLang's BFS slot order (depth, parent slot,
    id; within a depth the trees' pre-order), the ancestor mask in slots, and the EAGLE links."""
    b = tl.program_id(0).to(tl.int64)
    ids = tl.arange(0, NP)
    valid = ids < N
    big = 1 << 30
    par = tl.load(par_ptr + b * N + ids, mask=valid, other=-1)
    dep = tl.load(dep_ptr + b * N + ids, mask=valid, other=0)
    tok = tl.load(tok_ptr + b * N + ids, mask=valid, other=0)
    root_tok = tl.load(tok_ptr + b * N)
    # ancestors in node ids: anc[x, y] = y is x or an ancestor of x
    anc = (ids[:, None] == ids[None, :]) & valid[:, None]
    cur = par
    for _ in tl.static_range(MAXD):
        anc = anc | (ids[None, :] == cur[:, None])
        cur = tl.where(cur >= 0, _take(par, cur, ids), -1)
    anc_i = anc.to(tl.int64)
    size = tl.sum(anc_i, axis=0)  # subtree sizes
    elder = (par[:, None] == par[None, :]) & (ids[None, :] < ids[:, None]) & valid[:, None] & valid[None, :]
    before = tl.sum(tl.where(elder, size[None, :], 0), axis=1)  # nodes in the elder siblings' subtrees
    pre = dep + tl.sum(anc_i * before[None, :], axis=1)  # pre-order index within the depth
    key = tl.where(valid, dep * NP + pre, big)
    slot = tl.sum(((key[None, :] < key[:, None]) & valid[None, :]).to(tl.int64), axis=1)  # [x] slot of node x
    order = tl.sum(tl.where((slot[:, None] == ids[None, :]) & valid[:, None], ids[:, None], 0), axis=0)  # [s]
    real = ids < N
    s_tok = tl.where(real, _take(tok, order, ids), root_tok)
    pnode = tl.where(real, _take(par, order, ids), 0)
    s_par = tl.where(real, tl.where(pnode >= 0, _take(slot, pnode, ids), -1), 0)
    s_dep = tl.where(real, _take(dep, order, ids), 1)
    # ancestors in slots (padding rows: themselves and the root, since their parent slot is the root's)
    sanc = ids[:, None] == ids[None, :]
    cur = s_par
    for _ in tl.static_range(MAXD):
        sanc = sanc | (ids[None, :] == cur[:, None])
        cur = tl.where(cur >= 0, _take(s_par, cur, ids), -1)
    # links: siblings are contiguous; a parent's first child is its smallest child slot
    child = (s_par[None, :] == ids[:, None]) & (ids[None, :] >= 1) & (ids[None, :] < N)  # [p, s]
    first = tl.min(tl.where(child, ids[None, :], big), axis=1)
    next_token = tl.where(first < big, first, -1)
    s_par_next = _take(s_par, ids + 1, ids)
    next_sibling = tl.where((ids >= 1) & (ids + 1 < N) & (s_par_next == s_par), ids + 1, -1)
    in_s = ids < S
    prefix = tl.load(prefix_ptr + b)
    tl.store(order_ptr + b * N + ids, order.to(tl.int64), mask=valid)
    tl.store(tokens_ptr + b * S + ids, s_tok, mask=in_s)
    tl.store(parents_ptr + b * S + ids, s_par.to(tl.int64), mask=in_s)
    tl.store(depths_ptr + b * S + ids, s_dep.to(tl.int64), mask=in_s)
    tl.store(positions_ptr + b * S + ids, prefix + s_dep, mask=in_s)
    tl.store(index_ptr + b * S + ids, b * S + ids, mask=in_s)
    tl.store(next_token_ptr + b * S + ids, next_token.to(tl.int64), mask=in_s)
    tl.store(next_sibling_ptr + b * S + ids, next_sibling.to(tl.int64), mask=in_s)
    in_ss = in_s[:, None] & in_s[None, :]
    tl.store(mask_ptr + b * S * S + ids[:, None] * S + ids[None, :], sanc.to(tl.int8), mask=in_ss)
    tl.store(depth_ptr + b, tl.max(tl.where(valid, dep, 0), axis=0).to(tl.int64))
    counts = tl.sum(((dep[:, None] == ids[None, :]) & valid[:, None] & (ids[None, :] >= 1)).to(tl.int64), axis=0)
    tl.store(width_ptr + b, tl.max(counts, axis=0))


@triton.jit
def full_mask_kernel(
    tree_ptr,  # int8 [bs, S, S] tree mask
    prefix_ptr,  # int64 [bs]
    out_ptr,  # int8 [sum_b S * (prefix_b + S)] out
    bs,
    S: tl.constexpr,
    BS_P: tl.constexpr,  # power of 2 >= bs
    BLOCK: tl.constexpr,
):
    """Row r of request b's FULL_MASK block: prefix_b ones, then the tree mask's row r."""
    b = tl.program_id(0)
    r = tl.program_id(1)
    others = tl.arange(0, BS_P)
    plens = tl.load(prefix_ptr + others, mask=others < bs, other=0)
    start = tl.sum(tl.where(others < b, S * (plens + S), 0), axis=0)
    plen = tl.load(prefix_ptr + b)
    row = plen + S
    base = start + r * row
    for c0 in range(0, row, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        tree_col = cols - plen
        tree = tl.load(tree_ptr + (b * S + r) * S + tree_col, mask=(tree_col >= 0) & (cols < row), other=1)
        tl.store(out_ptr + base + cols, tl.where(cols < plen, 1, tree).to(tl.int8), mask=cols < row)
