"""A torch version of SGLang 0.5.23's `tree_speculative_sampling_target_only` (a JIT CUDA kernel,
`kernels/jit/include/sgl_kernel/speculative/sampling.cuh`), for hosts that cannot build SGLang's JIT kernels.

What the kernel computes, per request (one CUDA block each; here vectorised over the batch, a loop over depth):
from the root, at each visited node one coin `u` (`uniform_samples[b, node]`); its children in sibling order
(`retrive_next_token` -> `retrive_next_sibling`); a running sum of the target's probabilities of the children's
tokens (`target_probs[b, node, token]`); the first child with target mass and `u < running / threshold_acc` (or its
own probability >= `threshold_single`) is accepted and the walk moves there. A rejected child's probability is
copied into `draft_probs` at the node's row, so where every child was rejected the bonus token is drawn (coin
`uniform_samples_for_final_sampling[b]`, inverse CDF) from `relu(target - draft_probs)`: the target without the
rejected children. With both thresholds 1.0, `draft_probs` all zeros on entry and distinct sibling tokens this is
inverse-CDF sampling from the target, exactly lossless for a fixed tree. Where the depth cap (`accept_index`'s
width - 1) ends the walk the bonus comes from the full target row (no child was tried).

Output contract (as the kernel): `predicts[retrive_index[b, node]]` = the token that follows `node` on the accepted
path (the accepted child's token, at the last node the bonus); `accept_index[b, 0..k]` = the path's
`retrive_index` values, root first; `accept_token_num[b]` = k, the accepted drafted tokens. Nothing else of
`predicts` / `accept_index` is written; `draft_probs` is scratch (written where children were rejected).

`chain_speculative_sampling_target_only` is the same function for the chain layout DFLASH passes
(`dflash_utils._get_or_create_chain_verify_buffers`: node i's next token is node i + 1, no siblings): no loop,
a fixed handful of kernels whatever the block size, so DFLASH's sampled round pays no more here than a kernel would
cost it. Both are checked against a plain per-row reference and by a distribution test on the CPU
(tests/runtime/test_standin_sampling.py).

The stand-in (`gpu_patches.py`, G6) installs the chain version as DFLASH's sampling verify.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _accepts(coin: Tensor, running: Tensor, prob: Tensor, threshold_single: float, threshold_acc: float) -> Tensor:
    """A child is accepted: it has target mass and the node's coin falls under the running sum of its siblings'
    probabilities up to it (or its own probability reaches threshold_single)."""
    return (prob > 0) & ((coin < running / threshold_acc) | (prob >= threshold_single))


def _sample_bonus(
    target_probs: Tensor, draft_probs: Tensor, rows: Tensor, node: Tensor, subtract: Tensor, coin: Tensor
) -> Tensor:
    """The kernel's final draw at each row's last node: inverse CDF of relu(target - draft) (draft left out where
    `subtract` is false: the depth cap ended the walk), the first token whose cumulative sum passes coin * total
    among tokens of positive mass; past the end (rounding) the last such token; with no mass at all the last
    token of the vocabulary."""
    q = target_probs[rows, node]  # [bs, V]
    p = draft_probs[rows, node] * subtract[:, None].to(q.dtype)
    r = (q - p).clamp(min=0)
    u = coin * r.sum(-1)
    cdf = r.cumsum(-1)
    positive = r > 0
    hit = (cdf > u[:, None]) & positive
    vocab = int(r.shape[-1])
    last = vocab - 1 - positive.flip(-1).to(torch.int8).argmax(-1)  # the last positive token (if any)
    fallback = torch.where(positive.any(-1), last, torch.full_like(last, vocab - 1))
    return torch.where(hit.any(-1), hit.to(torch.int8).argmax(-1), fallback)  # argmax: the first True


def tree_speculative_sampling_target_only(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    uniform_samples: Tensor,
    uniform_samples_for_final_sampling: Tensor,
    target_probs: Tensor,
    draft_probs: Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """The kernel on any tree (module docstring), in place. One host read (the longest sibling list, which bounds
    the inner loop); per depth level a few kernels per sibling rank. `deterministic` is accepted and ignored (one
    order of summation here)."""
    bs = int(candidates.shape[0])
    spec = int(accept_index.shape[1])
    if bs == 0:
        return
    threshold_acc = max(float(threshold_acc), 1e-9)
    dev = candidates.device
    rows = torch.arange(bs, device=dev)
    width = 1 + int((retrive_next_sibling >= 0).sum(-1).max())  # no sibling list is longer
    cur = torch.zeros(bs, dtype=torch.int64, device=dev)  # the last accepted node
    coin = uniform_samples[:, 0].float()
    num = torch.zeros(bs, dtype=torch.int64, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    accept_index[:, 0] = retrive_index[:, 0].to(accept_index.dtype)
    for _ in range(1, spec):
        child = torch.where(alive, retrive_next_token[rows, cur], -1)
        running = torch.zeros(bs, dtype=target_probs.dtype, device=dev)
        accepted = torch.zeros(bs, dtype=torch.bool, device=dev)
        for _ in range(width):
            trying = child >= 0
            c = child.clamp(min=0)
            token = candidates[rows, c]
            prob = target_probs[rows, cur, token]
            running = torch.where(trying, running + prob, running)
            ok = trying & _accepts(coin, running, prob, threshold_single, threshold_acc)
            reject = trying & ~ok
            draft_probs[rows, cur, token] = torch.where(reject, prob, draft_probs[rows, cur, token])
            last = retrive_index[rows, cur]
            predicts[last] = torch.where(ok, token, predicts[last].to(token.dtype)).to(predicts.dtype)
            slot = (num + 1).clamp(max=spec - 1)
            accept_index[rows, slot] = torch.where(
                ok, retrive_index[rows, c], accept_index[rows, slot].to(retrive_index.dtype)
            ).to(accept_index.dtype)
            num = num + ok.to(torch.int64)
            cur = torch.where(ok, c, cur)
            coin = torch.where(ok, uniform_samples[rows, c].float(), coin)
            child = torch.where(ok | ~trying, -1, retrive_next_sibling[rows, c])
            accepted = accepted | ok
        alive = alive & accepted
    accept_token_num.copy_(num.to(accept_token_num.dtype))
    bonus = _sample_bonus(
        target_probs, draft_probs, rows, cur, num != spec - 1, uniform_samples_for_final_sampling.float()
    )
    predicts[retrive_index[rows, cur]] = bonus.to(predicts.dtype)


def chain_speculative_sampling_target_only(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    uniform_samples: Tensor,
    uniform_samples_for_final_sampling: Tensor,
    target_probs: Tensor,
    draft_probs: Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """The kernel on a chain (node i's only child is node i + 1; the links are not read): every level's test at
    once, the accepted length as the count of leading passes. Same contract and results as
    `tree_speculative_sampling_target_only` on that layout."""
    bs, n = candidates.shape
    spec = int(accept_index.shape[1])
    if bs == 0:
        return
    threshold_acc = max(float(threshold_acc), 1e-9)
    dev = candidates.device
    rows = torch.arange(bs, device=dev)
    levels = spec - 1  # the depth cap: node j (1..levels) is tried under node j - 1's row and coin
    parent = torch.arange(levels, device=dev)
    token = candidates[:, 1:spec]  # [bs, levels]
    prob = target_probs[rows[:, None], parent[None, :], token]
    ok = _accepts(uniform_samples[:, :levels].float(), prob, prob, threshold_single, threshold_acc)
    num = ok.to(torch.int64).cumprod(-1).sum(-1)  # leading passes
    depth = torch.arange(spec, device=dev)[None, :]  # accept_index slot k holds node k while k <= num
    accept_index.copy_(torch.where(depth <= num[:, None], retrive_index[:, :spec], accept_index.long()))
    cur = num
    tried = num < levels  # the walk stopped at a rejected child (else the depth cap stopped it)
    c = (num + 1).clamp(max=n - 1)
    rejected = candidates[rows, c]
    draft_probs[rows, cur, rejected] = torch.where(
        tried, target_probs[rows, cur, rejected], draft_probs[rows, cur, rejected]
    )
    accept_token_num.copy_(num.to(accept_token_num.dtype))
    bonus = _sample_bonus(target_probs, draft_probs, rows, cur, tried, uniform_samples_for_final_sampling.float())
    # predicts at node k (k < num): node k + 1's token; at node num: the bonus
    nxt = torch.cat([candidates[:, 1:spec], candidates[:, :1]], dim=1)  # the last column is never used
    values = torch.where(depth < num[:, None], nxt, bonus[:, None])
    where = retrive_index[:, :spec]
    keep = depth <= num[:, None]
    predicts[where] = torch.where(keep, values, predicts[where].long()).to(predicts.dtype)
