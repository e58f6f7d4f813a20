"""The tree worker's runtime self-check: an accepted path re-verified as a chain.

A tree verify is exact only if every node saw exactly its own ancestors (attention mask, and on hybrid targets
the recurrent state and conv window of its parent). A chain verify of the accepted path (DFLASH's own verify,
causal, no tree metadata) computes the same logits by a different route; its argmax at each path position must
equal the token the tree verify committed there. Sampled every DDTREE_SELFCHECK_EVERY rounds (off by default),
it costs one extra target forward on those rounds. `SelfCheck` is the tree worker's self-check: when a round is
due, what a check round keeps (the chain's results, so the round is exact whatever the check finds) and the
verdict (one INFO line, or one ERROR line and DFLASH's rounds from then on). The forwards it needs come through
a `ChainVerifier` (the round's verifier, `ddtree.sglang.round_verify`); the rest is tensor math, without SGLang.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ddtree.sglang.batch_round import BatchCommit
from ddtree.sglang.tree_round import DraftBlock, KeptRound, KVWindow, PlannedRound, VerifiedRound, reproducible

logger = logging.getLogger("ddtree")


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


# Two verifies of the same path (tree mask vs causal chain, other attention kernels, maybe TF32 dots) round
# differently; where the chain's top logits are this close, either token is a correct greedy answer. A tree verify
# that is really wrong (a hybrid conv-window bug: siblings sharing one window) misses by logits of 10 and more.
TIE_TOLERANCE = {torch.float32: 0.05, torch.bfloat16: 0.5, torch.float16: 0.25}


def mismatch_gaps(chain_logits: Tensor, check: ChainCheck, tree_tokens: Tensor) -> Tensor:
    """[bs] float: at each request's first mismatch, the chain's logit for its own token minus its logit for the
    tree's token (>= 0); 0 where the two agree. chain_logits: [bs, B, V]."""
    at = check.mismatch.clamp(min=0)  # [bs]
    rows = chain_logits.gather(1, at.view(-1, 1, 1).expand(-1, 1, chain_logits.shape[-1])).squeeze(1).float()
    chain_token = check.out_tokens.gather(1, at.unsqueeze(1))  # the chain's token at the mismatch (its bonus)
    tree_token = tree_tokens.gather(1, at.unsqueeze(1))
    gap = (rows.gather(1, chain_token) - rows.gather(1, tree_token)).squeeze(1)
    return torch.where(check.mismatch >= 0, gap, torch.zeros_like(gap))


# What the tree round would commit for a hybrid target (the last accepted node's conv window and recurrent
# state) against what the chain verify holds at the same path position. Both come from separate forwards whose
# layer inputs round differently (bf16), so the bound is relative; a window holding another node's inputs (the
# chain-layout bug: siblings sharing one window) is off by O(1).
STATE_TOLERANCE = 0.1


@dataclass(frozen=True)
class AcceptedStates:
    """Per request, at one step of the verify's per-step buffers: conv windows and recurrent-state norms."""

    windows: list[Tensor]  # per conv type [L, bs, ...]
    state_norms: Tensor  # [L, bs] float32


def accepted_states(windows: list[Tensor], states: Tensor | None, steps: Tensor) -> AcceptedStates:
    """windows: SGLang's per-step conv-window buffers [L, rows, steps, ...] per conv type; states: its per-step
    recurrent states [L, rows, steps, ...] (or None); request b's verify rows are row b; steps: [bs] the step to
    read. Copies (the next verify overwrites the buffers); the states only as per-layer norms, one layer at a
    time (a 27B-sized state is ~100 MB per request)."""
    rows = torch.arange(steps.shape[0], device=steps.device)
    picked = [window[:, rows, steps].clone() for window in windows]
    if states is None:
        norms = torch.zeros(0, steps.shape[0], device=steps.device)
    else:
        layers = range(states.shape[0])
        norms = torch.stack([states[layer, rows, steps].float().flatten(1).norm(dim=1) for layer in layers])
    return AcceptedStates(windows=picked, state_norms=norms)


def state_gaps(tree: AcceptedStates, chain: AcceptedStates, confirmed: Tensor) -> Tensor:
    """[bs] float: the largest relative difference between the tree's and the chain's states over conv types,
    layers and state norms, for requests whose whole path the chain confirmed (`confirmed` [bs] bool); 0 else."""
    gaps = torch.zeros(confirmed.shape[0], device=confirmed.device)
    pairs = list(zip(tree.windows, chain.windows, strict=True))
    if tree.state_norms.numel():
        pairs.append((tree.state_norms.unsqueeze(-1), chain.state_norms.unsqueeze(-1)))
    for a, b in pairs:
        a, b = a.float().transpose(0, 1).flatten(1), b.float().transpose(0, 1).flatten(1)  # [bs, ...]
        scale = b.abs().amax(dim=1).clamp(min=1e-6)
        gaps = torch.maximum(gaps, (a - b).abs().amax(dim=1) / scale)
    return torch.where(confirmed, gaps, torch.zeros_like(gaps))


def chain_accept_index(batch_size: int, width: int, device: torch.device) -> Tensor:
    """[bs, B] int32 flat rows b * B + j: a chain verify's accept index (every position, in order), for SGLang's
    commit of the hybrid states (which reads the row at commit_len - 1)."""
    rows = torch.arange(batch_size, device=device, dtype=torch.int32).unsqueeze(1) * width
    return rows + torch.arange(width, device=device, dtype=torch.int32).unsqueeze(0)


class ChainVerifier(Protocol):
    """What a check round needs from the round's verifier (`ddtree.sglang.round_verify.TreeVerifier`)."""

    block: int

    def chain_verify(
        self, batch: Any, draft_input: Any, tokens: Tensor, window: KVWindow
    ) -> tuple[Any, Tensor, Tensor]:
        """DFLASH's causal verify of `tokens` [bs, B] in `window`: (logits output, logits [bs, B, V], choices)."""
        ...

    def verify_states(self, steps: Tensor) -> AcceptedStates:
        """The last verify's per-step conv windows and recurrent-state norms at `steps` [bs] (hybrid targets)."""
        ...

    def hidden_loc(self, window: KVWindow, width: int) -> Tensor:
        """[bs, width] int64: the drafter's KV locations of the window's first `width` slots."""
        ...


class SelfCheck:
    """Every `every`-th tree round (0: never) re-verifies the accepted paths as chains. A failed check sets
    `fallback` (its text), and the worker runs DFLASH's rounds from then on. `rank` 0 writes the INFO lines."""

    def __init__(self, every: int, rank: int) -> None:
        self.every, self.rank = every, rank
        self.rounds = 0  # tree rounds so far
        self.fallback = ""  # set by a failed check

    def due(self) -> bool:
        """Counts one tree round; whether it is a check round."""
        self.rounds += 1
        return bool(self.every) and self.rounds % self.every == 0

    def keep_chain(
        self,
        verifier: ChainVerifier,
        batch: Any,
        draft_input: Any,
        draft: DraftBlock,
        planned: PlannedRound,
        verified: VerifiedRound,
        commit: BatchCommit,
    ) -> KeptRound:
        """A check round: the accepted paths re-verified as chains in the draft window (path order: nothing to
        permute), compared with the tree's verdict; the chain's results are kept, so the round is exact
        whatever the check finds."""
        bs, slots = commit.perm.shape
        block, device = verifier.block, commit.perm.device
        path_tokens = planned.plan.tokens.gather(1, commit.perm)[:, :block]  # [bs, B]: the path, then filler
        tree_states = None
        if verified.conv_snapshot is not None:  # hybrid: what the tree would commit, before it is overwritten
            lens = commit.commit_lens.to(torch.int64)
            last = verified.accept_index.to(torch.int64).gather(1, (lens - 1).unsqueeze(1)).squeeze(1)
            tree_states = verifier.verify_states(last - torch.arange(bs, device=device) * slots)
            for conv, rows, saved in verified.conv_snapshot:
                conv[:, rows] = saved
        logits_output, chain_logits, chain_predict = verifier.chain_verify(
            batch, draft_input, path_tokens, draft.window
        )
        check = chain_check(commit.out_tokens, commit.commit_lens, chain_predict)
        gaps = None
        if tree_states is not None:
            chain_states = verifier.verify_states(commit.commit_lens.to(torch.int64) - 1)
            gaps = state_gaps(tree_states, chain_states, check.mismatch < 0)
        self.report(check, commit.out_tokens, chain_logits, chain_predict, gaps, reproducible(batch))
        return KeptRound(
            commit_lens=check.commit_lens,
            out_tokens=check.out_tokens,
            bonus=check.bonus,
            state_index=chain_accept_index(bs, block, device),
            state_width=block,
            predict=chain_predict.reshape(-1),
            hidden_rows=None,
            hidden_loc=verifier.hidden_loc(draft.window, block),
            logits_output=logits_output,
        )

    def report(
        self,
        check: ChainCheck,
        tree_tokens: Tensor,
        chain_logits: Tensor,
        chain_predict: Tensor,
        state_gap: Tensor | None = None,
        compared: list[bool] | None = None,
    ) -> None:
        """One host read per check round. A token mismatch at a near-tie of the chain's logits is rounding
        (INFO); any other, or a hybrid state the tree would commit that differs from the chain's by more than
        STATE_TOLERANCE, is an ERROR, and DFLASH's rounds from now on. `compared`: the rows whose choices are
        reproducible (greedy or seeded); an unseeded sampled row's chain draws differently, by design."""
        if state_gap is not None:
            worst = int(state_gap.argmax())
            gap = float(state_gap[worst])
            if gap >= STATE_TOLERANCE:
                self.fail(
                    f"request {worst}: the recurrent state the tree would commit differs from the chain's by "
                    f"{gap:.3g} (relative)"
                )
                return
        gaps = mismatch_gaps(chain_logits, check, tree_tokens)
        tolerance = TIE_TOLERANCE.get(chain_logits.dtype, TIE_TOLERANCE[torch.bfloat16])
        differs = (check.mismatch >= 0).tolist()
        if compared is not None:
            differs = [d and c for d, c in zip(differs, compared, strict=True)]
        gap_list = gaps.tolist()
        bad = [b for b, d in enumerate(differs) if d and gap_list[b] >= tolerance]
        ties = [b for b, d in enumerate(differs) if d and gap_list[b] < tolerance]
        if not bad:
            near = ""
            if ties:
                near = f" (near-ties in {len(ties)} requests, max gap {max(gap_list[b] for b in ties):.3g})"
            if self.rank == 0:  # every tensor-parallel rank checks the same data
                logger.info("DDTREE self-check round %d: the tree verify equals the chain verify%s", self.rounds, near)
            return
        b = bad[0]
        at = int(check.mismatch[b])
        self.fail(
            f"request {b} path position {at}: tree verify {int(tree_tokens[b, at])}, chain verify "
            f"{int(chain_predict[b, at])}, logit gap {gap_list[b]:.3g}; {len(bad)} of {tree_tokens.shape[0]} "
            "requests differ"
        )

    def fail(self, what: str) -> None:
        """One ERROR line, and DFLASH's rounds for the rest of this process."""
        self.fallback = f"self-check round {self.rounds}: {what}"
        logger.error(
            "DDTREE self-check FAILED (%s): the tree verify is not exact on this setup; this process runs "
            "DFLASH's rounds from now on",
            self.fallback,
        )
