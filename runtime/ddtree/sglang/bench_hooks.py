"""The tree round's benchmark hooks, as one object the round calls at its three seams: the drafter's scores
before the plan (`planning`), the target's choices before the walk (`steer`), the committed paths (`committed`).

`RoundHooks` is what production runs: every seam returns its input unchanged, so the round carries no check
of its own for a hook. `BenchmarkHooks` (built when the configuration names a paths file, `RoundHooks.build`)
runs the acceptance replay (`DDTREE_REPLAY_ACCEPTANCE`: the recorded trees' shapes imposed on the drafter's
scores, the walk steered along the recorded paths) and the path recording (`DDTREE_RECORD_PATHS`: the values
each round's trees were planned from, and its accepted paths). What a paths file holds and how the replay
steers are `ddtree.sglang.replay`'s; opsctl never renders either variable. `SpineDemotion`
(`DDTREE_TEST_DEMOTE_SPINE`, tests only) swaps the drafter's first two choices at the first depth, so a tree
accepts off its spine whenever the drafter's first choice was right, on any tiny model's build; the
configuration refuses it beside a replay or a recording, which it would replace.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ddtree.config import DDTreeConfig
from ddtree.sglang.batch_round import BatchCommit, BatchPlan
from ddtree.sglang.replay import AcceptanceReplay, PathRecorder, ReplayRound, impose_topk, path_ranks, steer_predictions


class RoundHooks:
    """The production round's hooks: none (each seam hands its input back)."""

    @staticmethod
    def build(config: DDTreeConfig, block: int, vocab: int) -> RoundHooks:
        """The hooks `config` asks for: BenchmarkHooks with a replay or a recording, else these no-ops. A
        replayed file whose top-k tables do not fit this drafter ([block - 1, topk]) is refused here."""
        if config.test_demote_spine:
            return SpineDemotion()
        if not config.replay_acceptance and not config.record_paths:
            return RoundHooks()
        replay = AcceptanceReplay.from_file(config.replay_acceptance) if config.replay_acceptance else None
        if replay is not None:
            replay.check_drafter(block - 1, config.topk)
        paths = PathRecorder(config.record_paths) if config.record_paths else None
        return BenchmarkHooks(replay, paths, block - 1, config.topk, vocab)

    def planning(self, batch: Any, scores: Tensor, gathered: bool) -> Tensor:
        """The drafter's scores the trees are planned from: [bs, B - 1, V] log-probs (an inference tensor:
        call under inference mode), or with `gathered` the [bs, B - 1, k] top-k values of a vocab-parallel head."""
        return scores

    def steer(self, plan: BatchPlan, target_predict: Tensor) -> Tensor:
        """The target's choices [bs, S] the tree walk reads."""
        return target_predict

    def committed(self, batch: Any, plan: BatchPlan, commit: BatchCommit) -> None:
        """The round's commit, once made."""


class BenchmarkHooks(RoundHooks):
    """The acceptance replay and/or the path recording (either may be None)."""

    def __init__(
        self, replay: AcceptanceReplay | None, paths: PathRecorder | None, rows: int, topk: int, vocab: int
    ) -> None:
        self.replay, self.paths = replay, paths
        self.rows, self.topk, self.vocab = rows, topk, vocab
        self._round: ReplayRound | None = None  # this round's recording, from `planning` to `steer`

    def planning(self, batch: Any, scores: Tensor, gathered: bool) -> Tensor:
        self._round = None
        if self.replay is not None:  # the recorded trees' shapes and paths, one round further
            self._round = self.replay.next_round([req.rid for req in batch.reqs], self.rows)
        if self._round is not None and self._round.topk is not None:  # the recorded shapes, rank for rank
            if gathered:
                scores = self._round.topk.to(scores.device, non_blocking=True)
            else:
                impose_topk(scores, self._round.topk)
        if self.paths is not None:  # a recording run: the values the trees are planned from
            self.paths.draft_topk(scores if gathered else scores.topk(self.topk, dim=-1).values)
        return scores

    def steer(self, plan: BatchPlan, target_predict: Tensor) -> Tensor:
        if self._round is None:
            return target_predict
        links = (plan.retrieve_next_token, plan.retrieve_next_sibling)
        steered, _ = steer_predictions(plan.tokens, *links, target_predict, self._round.ranks, self.vocab)
        return steered

    def committed(self, batch: Any, plan: BatchPlan, commit: BatchCommit) -> None:
        if self.paths is not None:  # reads the paths to the host: a sync per round
            links = (plan.retrieve_next_token, plan.retrieve_next_sibling)
            self.paths.add([req.rid for req in batch.reqs], path_ranks(*links, commit.path))


class SpineDemotion(RoundHooks):
    """Tests only: the trees are planned from scores whose first depth has the drafter's first and second choices
    swapped, so the spine starts with its second choice and its first is a sibling. The verify is exact whatever
    the tree, so the tokens stay the baseline's; a round whose drafter was right at depth 1 accepts off the spine.
    A vocab-parallel head's gathered top-k keeps its order (its ids are not the hook's to swap)."""

    def planning(self, batch: Any, scores: Tensor, gathered: bool) -> Tensor:
        if gathered or scores.shape[-1] < 2:
            return scores
        return demote_first_choice(scores)


def demote_first_choice(scores: Tensor) -> Tensor:
    """scores [bs, B - 1, V] with row 0's two highest values swapped (a copy)."""
    out = scores.clone()
    first = out[:, 0, :]  # [bs, V]
    top = first.topk(2, dim=-1)  # values, indices: [bs, 2]
    first.scatter_(1, top.indices, top.values.flip(-1))
    return out
