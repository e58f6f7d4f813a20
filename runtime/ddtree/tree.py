"""Draft tree index math: build, compile (verify inputs) and walk (acceptance). Pure tensor functions.

A tree is a parent array in pop order. Node 0 is the root: the last committed (bonus) token, depth 0,
score 0. Node i > 0 is a drafted token at depth d >= 1 whose token comes from row d - 1 of the
drafter's log-probs and whose score is its parent's score plus that log-prob.

Order and tie-breaking (shared by `build_tree_reference` and `build_tree`, so they agree exactly):

1. Per row, the candidate tokens are the top-k by (log-prob descending, token id ascending); a token's
   rank is its position in that order.
2. Nodes are ranked by (score descending, depth ascending, parent id ascending, rank ascending) and the
   tree is the first `budget` nodes of that order; ids follow it. Scores are float32 sums computed as
   float32(parent score + log-prob), the same rounding in both builds.

This total order is monotone along the heap's expansion edges (a node after its parent, because
log-probs are <= 0 and depth breaks score ties; a sibling after its previous sibling, because ranks are
sorted), so the lazy best-first heap pops exactly this order, ids are parent-before-child, and a
parent's first child is its rank-0 child (the drafter's argmax: the spine).
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class DraftTree:
    tokens: Tensor  # [N] int64; node 0 is the root = the last committed (bonus) token
    parents: Tensor  # [N] int64; parents[0] == -1; parents[i] < i (parent before child)
    depths: Tensor  # [N] int64; depths[0] == 0
    scores: Tensor  # [N] float32; sum of path log-probs (root 0.0)

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        for name in ("tokens", "parents", "depths", "scores"):
            t: Tensor = getattr(self, name)
            if t.dim() != 1 or t.shape[0] != n or n < 1:
                raise ValueError(f"DraftTree.{name} must be 1-D with the same length >= 1, got {t.shape}")

    @property
    def num_nodes(self) -> int:
        """N, the root included (no device sync)."""
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class TreeShape:
    nodes: int  # drafted nodes, root excluded (<= budget)
    depth: int  # deepest drafted node (0 for a root-only tree)
    width: int  # most nodes at one depth >= 1 (0 for a root-only tree)


@dataclass(frozen=True)
class TreeInputs:
    input_ids: Tensor  # [N]
    position_ids: Tensor  # [N] prefix_len + depth
    attention_mask: Tensor  # [N, N] bool, mask[i, j] = j is i or an ancestor of i
    parents: Tensor  # [N]
    depth_groups: tuple[Tensor, ...]  # node ids per depth, depth 0..max, ascending ids


@dataclass(frozen=True)
class WalkResult:
    accepted: tuple[int, ...]  # node ids on the accepted path, starting with 0 (root), in path order
    bonus_token: int  # the target's token after the last accepted node
    # committed tokens this round = tokens[accepted[1:]] + [bonus_token]; tau = len(accepted)


# ---------------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------------


def _check_build_args(draft_logprobs: Tensor, budget: int, topk: int) -> None:
    if draft_logprobs.dim() != 2 or draft_logprobs.shape[1] < 1:
        raise ValueError(f"draft_logprobs must be [D, V] with V >= 1, got {tuple(draft_logprobs.shape)}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")


def _bad_logprob_error() -> ValueError:
    return ValueError("draft_logprobs must be log-probabilities: every value <= 0 (or -inf), no NaN")


def _make_tree(tokens: Tensor, parents: Tensor, depths: Tensor, scores: Tensor) -> DraftTree:
    return DraftTree(
        tokens=tokens.to(torch.int64),
        parents=parents.to(torch.int64),
        depths=depths.to(torch.int64),
        scores=scores.to(torch.float32),
    )


def _root_only(root_token: int, device: torch.device) -> DraftTree:
    return _make_tree(
        torch.tensor([root_token], device=device),
        torch.tensor([-1], device=device),
        torch.tensor([0], device=device),
        torch.zeros(1, device=device),
    )


def _f32(x: float) -> float:
    """Round a Python float to float32 (exact for a sum of two float32 values: no double-rounding issue)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:  # beyond float32 range: float32 arithmetic would give an infinity
        return float("-inf") if x < 0 else float("inf")


def _row_topk_reference(row: Tensor, k: int) -> tuple[list[float], list[int]]:
    """The k best tokens of one row by (log-prob desc, token id asc), in that order: a plain Python sort
    over every token that ties or beats the k-th best value. Returns (log-probs, token ids)."""
    if bool(torch.isnan(row).any()) or float(row.max()) > 0.0:
        raise _bad_logprob_error()
    kth = float(row.topk(k).values[-1])
    cand = torch.nonzero(row >= kth).flatten()  # every token at least as good as the k-th
    pairs = list(zip(row[cand].tolist(), cand.tolist(), strict=True))
    pairs.sort(key=lambda p: (-p[0], p[1]))
    best = pairs[:k]
    return [v for v, _ in best], [t for _, t in best]


def expand_best_first(
    row_vals: list[list[float]], row_ids: list[list[int]], root_token: int, budget: int
) -> tuple[list[int], list[int], list[int], list[float]]:
    """The best-first heap with lazy expansion over a per-row top-k table (row d: depth d + 1 candidates,
    best first). Pop the best candidate, give it the next id, push its first child and its next sibling.
    Returns (tokens, parents, depths, scores) as lists, root first."""
    n_rows, k = len(row_vals), len(row_vals[0]) if row_vals else 0
    tokens, parents, depths, scores = [root_token], [-1], [0], [0.0]
    heap: list[tuple[float, int, int, int]] = []  # (-score, depth, parent id, rank): the tie-break order

    def push(parent: int, rank: int) -> None:
        row = depths[parent]  # a child of a depth-d node uses row d
        if row >= n_rows or rank >= k:
            return
        score = _f32(scores[parent] + row_vals[row][rank])
        heapq.heappush(heap, (-score, row + 1, parent, rank))

    push(0, 0)
    while heap and len(tokens) <= budget:
        neg_score, depth, parent, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(row_ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        scores.append(-neg_score)
        push(node, 0)  # its first child
        push(parent, rank + 1)  # its next sibling
    return tokens, parents, depths, scores


def _tree_from_lists(lists: tuple[list[int], list[int], list[int], list[float]], device: torch.device) -> DraftTree:
    tokens, parents, depths, scores = lists
    return _make_tree(
        torch.tensor(tokens, device=device),
        torch.tensor(parents, device=device),
        torch.tensor(depths, device=device),
        torch.tensor(scores, dtype=torch.float32, device=device),
    )


def build_tree_reference(draft_logprobs: Tensor, root_token: int, budget: int, topk: int) -> DraftTree:
    """Best-first heap (lazy expansion) over the drafter's per-row top-k. Slow and obviously right: the
    top-k of every row by a plain Python sort, then `expand_best_first`.

    draft_logprobs: [D, V], row d-1 = drafter's log-probs for depth d (D = block_size - 1).
    """
    _check_build_args(draft_logprobs, budget, topk)
    lp = draft_logprobs.detach().to("cpu", torch.float32)  # lp: [D, V]
    n_rows = min(lp.shape[0], budget)  # a path longer than budget can never be kept
    k = min(topk, lp.shape[1])
    rows = [_row_topk_reference(lp[d], k) for d in range(n_rows)]
    table = expand_best_first([v for v, _ in rows], [t for _, t in rows], root_token, budget)
    return _tree_from_lists(table, draft_logprobs.device)


def build_tree_heap(
    draft_logprobs: Tensor, root_token: int, budget: int, topk: int, device: torch.device | None = None
) -> DraftTree:
    """Same tree again: the fast per-row top-k (`row_topk`) feeding the Python heap (`expand_best_first`).
    At budgets up to 512 the heap's few hundred pops cost less than the vectorized build's per-depth
    tensor ops (docs/runtime-perf.md), so this is the cheapest eager build; `build_tree` keeps a fixed
    number of tensor ops per depth, with static shapes. `device`: where the tree's tensors go (default: the
    log-probs' device); the vocab-sized top-k always runs where the log-probs are, and only [R, k + 1] values
    cross to the host, so a caller that wants the tree on the host passes `torch.device("cpu")` instead of
    copying [R, V] log-probs over."""
    _check_build_args(draft_logprobs, budget, topk)
    out = draft_logprobs.device if device is None else device
    n_rows = min(draft_logprobs.shape[0], budget)
    if n_rows == 0:
        return _root_only(root_token, out)
    lp = draft_logprobs.detach()[:n_rows].to(torch.float32)  # lp: [R, V]
    vals, ids = row_topk(lp, min(topk, lp.shape[1]))  # [R, k] each, host
    table = expand_best_first(vals.tolist(), ids.tolist(), root_token, budget)
    return _to_device(_tree_from_lists(table, torch.device("cpu")), out)


def _stable_sort_desc(x: Tensor) -> Tensor:
    """Indices sorting x descending; equal values keep their index order (ascending)."""
    return torch.sort(x, descending=True, stable=True).indices


def row_topk(lp: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per-row top-k by (log-prob desc, token id asc); raises on values > 0 or NaN.

    lp: [R, V] float32 on any device, k <= V. Returns (values [R, k], token ids [R, k]) on the CPU: the
    one vocab-sized op (topk) runs where lp lives, the tie handling on k + 1 values per row runs on the host.
    """
    n_rows, vocab = lp.shape
    kk = min(k + 1, vocab)  # k + 1: a strict gap below the k-th value proves the top-k set is unique
    top_vals, top_ids = lp.topk(kk, dim=-1)  # [R, kk], on lp's device
    top_vals, top_ids = top_vals.cpu(), top_ids.cpu()
    if not bool((top_vals[:, 0] <= 0).all()):  # NaN sorts first in topk and fails the comparison
        raise _bad_logprob_error()
    cut_tie = (top_vals[:, k - 1] == top_vals[:, k]).tolist() if kk > k else [False] * n_rows
    # Canonical order inside the set: sort by id, then stable-sort by value descending.
    ids, perm = top_ids[:, :k].sort(dim=-1)
    vals = top_vals[:, :k].gather(1, perm)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    vals, ids = vals.gather(1, order), ids.gather(1, order)
    for r in (r for r, tie in enumerate(cut_tie) if tie):  # rare: the cut falls inside a run of equal values
        cand = torch.nonzero(lp[r] >= float(vals[r, k - 1])).flatten()  # ascending ids, on lp's device
        cand_vals = lp[r, cand].cpu()
        take = _stable_sort_desc(cand_vals)[:k]
        ids[r], vals[r] = cand.cpu()[take], cand_vals[take]
    return vals, ids


def _to_device(tree: DraftTree, device: torch.device) -> DraftTree:
    """Move a host-built tree with two copies (the int fields stacked), not four."""
    if device.type == "cpu":
        return tree
    ints = torch.stack([tree.tokens, tree.parents, tree.depths]).to(device)  # [3, N]
    return DraftTree(tokens=ints[0], parents=ints[1], depths=ints[2], scores=tree.scores.to(device))


def build_tree(draft_logprobs: Tensor, root_token: int, budget: int, topk: int) -> DraftTree:
    """Vectorized best-first tree, identical to `build_tree_reference` (same ids, tokens, parents, scores).

    draft_logprobs: [D, V], row d-1 = drafter's log-probs for depth d (D = block_size - 1).
    Depth by depth, the best `budget` nodes of each depth are kept (ordered by score desc, parent position,
    rank); a global stable sort over all kept nodes then gives the heap's pop order. This is exact because
    scores never increase along a path, so the global best `budget` nodes are closed under ancestors.
    Only the per-row topk touches the vocabulary (on the input's device); the index math is at most
    budget * topk values per depth and runs on the host, where a tiny op costs microseconds rather than a
    kernel launch. The tree comes back on the input's device.
    """
    _check_build_args(draft_logprobs, budget, topk)
    device = draft_logprobs.device
    n_rows = min(draft_logprobs.shape[0], budget)
    if n_rows == 0:
        return _root_only(root_token, device)
    lp = draft_logprobs.detach()[:n_rows].to(torch.float32)  # lp: [R, V]
    k = min(topk, lp.shape[1])
    row_vals, row_ids = row_topk(lp, k)  # [R, k] each, host

    level_scores: list[Tensor] = []  # per depth d+1: [M_d] kept scores, within-depth order
    level_parent: list[Tensor] = []  # [M_d] parent position inside the previous level
    level_tokens: list[Tensor] = []  # [M_d]
    prev_scores = torch.zeros(1)  # the root
    for d in range(n_rows):
        cand = (prev_scores[:, None] + row_vals[d][None, :]).reshape(-1)  # [P*k], parent-major, rank-minor
        order = _stable_sort_desc(cand)[:budget]  # (score desc, parent pos asc, rank asc)
        prev_scores = cand[order]
        level_scores.append(prev_scores)
        level_parent.append(torch.div(order, k, rounding_mode="floor"))
        level_tokens.append(row_ids[d][order % k])

    sizes = [s.shape[0] for s in level_scores]
    offsets = [0]
    for m in sizes[:-1]:
        offsets.append(offsets[-1] + m)
    scores = torch.cat(level_scores)  # [M] flat index ascending = (depth asc, within-depth position asc)
    depths = torch.repeat_interleave(torch.arange(1, n_rows + 1), torch.tensor(sizes))  # [M]
    tokens = torch.cat(level_tokens)
    # Parent as a flat index (-1 = the root).
    parent_flat = torch.cat(
        [torch.full((sizes[0],), -1)] + [level_parent[d] + offsets[d - 1] for d in range(1, n_rows)]
    )

    n_keep = min(budget, scores.shape[0])
    sel = _stable_sort_desc(scores)[:n_keep]  # [n] flat indices in pop order
    # Node id of every flat index, shifted by one so the root (-1) maps to id 0 through index 0.
    node_id = torch.full((scores.shape[0] + 1,), -1, dtype=torch.int64)
    node_id[0] = 0
    node_id[sel + 1] = torch.arange(1, n_keep + 1)
    parents = node_id[parent_flat[sel] + 1]

    tree = _make_tree(
        torch.cat([torch.tensor([root_token]), tokens[sel]]),
        torch.cat([torch.tensor([-1]), parents]),
        torch.cat([torch.tensor([0]), depths[sel]]),
        torch.cat([torch.zeros(1), scores[sel]]),
    )
    return _to_device(tree, device)


def spine_tree(draft_logprobs: Tensor, root_token: int, depth: int) -> DraftTree:
    """The drafter's argmax chain of `depth` nodes (ties: smallest token id), for linear/shadow verify.

    Equals build_tree(draft_logprobs, root_token, budget=depth, topk=1).
    """
    n_rows = draft_logprobs.shape[0]
    if not 0 <= depth <= n_rows:
        raise ValueError(f"spine depth must be in 0..{n_rows} (rows of draft_logprobs), got {depth}")
    device = draft_logprobs.device
    lp = draft_logprobs.detach()[:depth].to(torch.float32)  # lp: [depth, V]
    ids = lp.argmax(dim=-1)  # [depth]; argmax returns the first (smallest) index among ties
    vals = lp.gather(1, ids[:, None]).flatten().tolist()
    if not all(v <= 0.0 for v in vals):  # NaN fails the comparison too
        raise _bad_logprob_error()
    scores = [0.0]
    for v in vals:  # sequential float32 sums, the same rounding as build_tree (cumsum may accumulate wider)
        scores.append(_f32(scores[-1] + v))
    root = torch.tensor([root_token], device=device)
    return _make_tree(
        torch.cat([root, ids]),
        torch.arange(-1, depth, device=device),
        torch.arange(0, depth + 1, device=device),
        torch.tensor(scores, dtype=torch.float32, device=device),
    )


def tree_shape(tree: DraftTree) -> TreeShape:
    """Effective shape for logs: a chain has width 1, so nobody mistakes a chain for a tree."""
    counts = torch.bincount(tree.depths).tolist()  # [max_depth + 1]
    drafted = counts[1:]
    return TreeShape(nodes=tree.num_nodes - 1, depth=len(drafted), width=max(drafted, default=0))


# ---------------------------------------------------------------------------------------------------
# Compile: verify inputs
# ---------------------------------------------------------------------------------------------------


def depth_groups(depths: Tensor) -> tuple[Tensor, ...]:
    """Node ids per depth 0..max, ascending ids inside a group. depths: [N]."""
    order = torch.argsort(depths, stable=True)  # [N]
    counts = torch.bincount(depths).tolist()
    return tuple(torch.split(order, counts))


def ancestor_mask(parents: Tensor, groups: tuple[Tensor, ...]) -> Tensor:
    """mask[i, j] = j is i or an ancestor of i. Row-inheriting: mask[i] = mask[parent[i]] | onehot(i),
    done for a whole depth at once (its parents' rows are final by then). parents: [N] -> [N, N] bool."""
    n = parents.shape[0]
    mask = torch.eye(n, dtype=torch.bool, device=parents.device)  # [N, N], the onehot(i) part
    for group in groups[1:]:
        mask[group] |= mask[parents[group]]
    return mask


def compile_tree(tree: DraftTree, prefix_len: int) -> TreeInputs:
    """Verify-forward inputs: the tree's tokens at positions prefix_len + depth, ancestor-only mask.

    The index math runs on the host (a few dozen tiny ops); an accelerator gets the results in two copies.
    """
    device = tree.tokens.device
    host = torch.stack([tree.parents, tree.depths]).cpu()  # [2, N], one copy
    parents, depths = host[0], host[1]
    groups = depth_groups(depths)
    mask = ancestor_mask(parents, groups)
    if device.type != "cpu":
        order = torch.cat(groups).to(device)  # [N] ids grouped by depth, one copy
        groups = tuple(torch.split(order, [g.shape[0] for g in groups]))
        mask = mask.to(device)
    return TreeInputs(
        input_ids=tree.tokens,
        position_ids=tree.depths + prefix_len,
        attention_mask=mask,
        parents=tree.parents,
        depth_groups=groups,
    )


# ---------------------------------------------------------------------------------------------------
# Walk: acceptance
# ---------------------------------------------------------------------------------------------------


def sample_token(logits: Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    """The target's token from one row of logits: argmax (ties: smallest id) at temperature 0, else a sample
    from softmax(logits / temperature). logits: [V]. Baseline decoding should use this same function so a
    fixed generator gives comparable streams."""
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.to(torch.float32) / temperature, dim=-1)  # [V]
    return int(torch.multinomial(probs, 1, generator=generator))


def walk_tree(
    tree: DraftTree,
    target_logits: Tensor,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> WalkResult:
    """Follow the child whose token is the target's choice at the current node; the first miss (or a leaf)
    ends the walk and the target's choice there is the bonus token. Lossless: every committed token is the
    target's own choice given its accepted prefix. One choice (argmax or one sample) per visited node.

    target_logits: [N, V], row i = the target's next-token logits after node i. Duplicate sibling tokens
    (possible only in hand-built trees) resolve to the smallest child id.
    """
    n = tree.num_nodes
    if target_logits.dim() != 2 or target_logits.shape[0] != n:
        raise ValueError(f"target_logits must be [N={n}, V], got {tuple(target_logits.shape)}")
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    parents, tokens = torch.stack([tree.parents, tree.tokens]).tolist()  # one copy
    choose: Callable[[int], int]
    if temperature == 0.0 and _batch_greedy(target_logits.device):
        choose = target_logits.argmax(dim=-1).tolist().__getitem__  # [N]: one kernel, one copy
    else:

        def choose(node: int) -> int:  # only visited rows: an N x V argmax would dominate on a CPU
            return sample_token(target_logits[node], temperature, generator)

    return walk_visiting(parents, tokens, lambda path: choose(path[-1]))


def walk_visiting(parents: Sequence[int], tokens: Sequence[int], choose: Callable[[list[int]], int]) -> WalkResult:
    """The walk, asking for a choice only at the nodes it visits: from the root (node 0), follow the child whose
    token is the current node's choice; the first choice with no such child is the bonus. choose(path) gets the
    accepted nodes from the root to the current one (a rule can read the path's tokens) and returns the target's
    choice there: one call per committed token, in order, so a seeded generator draws what a token-by-token
    decode draws. parents[i] < i (parents[0] = -1); duplicate sibling tokens resolve to the smallest child id."""
    children: dict[tuple[int, int], int] = {}
    for node in range(1, len(parents)):
        children.setdefault((int(parents[node]), int(tokens[node])), node)
    accepted = [0]
    while True:
        choice = int(choose(list(accepted)))
        nxt = children.get((accepted[-1], choice))
        if nxt is None:
            return WalkResult(accepted=tuple(accepted), bonus_token=choice)
        accepted.append(nxt)


def _batch_greedy(device: torch.device) -> bool:
    """Greedy walk: argmax every row at once on accelerators (launch-bound), only visited rows on a CPU."""
    return device.type != "cpu"


def is_off_spine(tree: DraftTree, accepted: tuple[int, ...]) -> bool:
    """True if the accepted path left the spine: some accepted node is not its parent's first child
    (smallest id = rank 0 = the drafter's argmax in a built tree)."""
    if len(accepted) <= 1:
        return False
    first_child: dict[int, int] = {}
    for node, parent in enumerate(tree.parents.tolist()):
        if node:
            first_child.setdefault(parent, node)
    parents = tree.parents.tolist()
    return any(first_child[parents[node]] != node for node in accepted[1:])
