"""The tree worker's runtime self-check: an accepted path re-verified as a chain.

A tree verify is exact only if every node saw exactly its own ancestors (attention mask, and on hybrid targets
the recurrent state and conv window of its parent). A chain verify of the accepted path (DFLASH's own verify,
causal, no tree metadata) computes the same logits by a different route; its argmax at each path position must
equal the token the tree verify committed there. Sampled every DDTREE_SELFCHECK_EVERY rounds (off by default),
it costs one extra target forward on those rounds. Pure tensor math here; the worker runs the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ChainCheck:
    """What a check round commits: the chain verify's own acceptance of the path the tree accepted."""

    commit_lens: Tensor  # [bs] int32: path tokens confirmed by the chain, + its bonus (<= the tree's)
    out_tokens: Tensor  # [bs, B] int64: the chain's tokens along the path (confirmed drafts, then its bonus)
    bonus: Tensor  # [bs] int64
    mismatch: Tensor  # [bs] int64: first path position where the tree's token differs from the chain's, else -1


def chain_check(tree_tokens: Tensor, tree_commit_lens: Tensor, chain_predict: Tensor) -> ChainCheck:
    """tree_tokens: [bs, >= B] the tokens the tree round commits (its argmax along the accepted path);
    tree_commit_lens: [bs] how many; chain_predict: [bs, B] the chain verify's argmax after each path position
    (the path's tokens were its inputs). Where the two agree, the check round commits exactly the tree's
    tokens; from the first disagreement on, only the chain's (DFLASH's acceptance rule)."""
    width = chain_predict.shape[1]
    pos = torch.arange(width, device=chain_predict.device).unsqueeze(0)  # [1, B]
    live = pos < tree_commit_lens.to(torch.int64).unsqueeze(1)
    differs = (tree_tokens[:, :width] != chain_predict) & live  # [bs, B]
    any_differs = differs.any(dim=1)
    first = differs.to(torch.int8).argmax(dim=1)  # the first True (argmax returns the first maximum)
    lens = torch.where(any_differs, first + 1, tree_commit_lens.to(torch.int64))
    out = torch.where(pos < lens.unsqueeze(1), chain_predict, torch.zeros_like(chain_predict))
    bonus = chain_predict.gather(1, (lens - 1).unsqueeze(1)).squeeze(1)
    mismatch = torch.where(any_differs, first, torch.full_like(first, -1))
    return ChainCheck(commit_lens=lens.to(torch.int32), out_tokens=out, bonus=bonus, mismatch=mismatch)


def chain_accept_index(batch_size: int, width: int, device: torch.device) -> Tensor:
    """[bs, B] int32 flat rows b * B + j: a chain verify's accept index (every position, in order), for SGLang's
    commit of the hybrid states (which reads the row at commit_len - 1)."""
    rows = torch.arange(batch_size, device=device, dtype=torch.int32).unsqueeze(1) * width
    return rows + torch.arange(width, device=device, dtype=torch.int32).unsqueeze(0)
