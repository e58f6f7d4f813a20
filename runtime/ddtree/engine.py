"""Reference engine: prefill + decode on plain PyTorch/transformers for every mode (batch size 1).

- baseline: one transformers decode step per token (the greedy reference for lossless checks).
- linear:   verify the drafter's argmax chain (depth block_size - 1), the DFlash chain verify.
- shadow:   build the full DDTree every round and log its statistics, verify only the spine (== linear).
- tree:     verify the whole tree in one target forward with the ancestor-only mask.

One round (speculative modes), on one screen in `_spec_rounds`:
draft log-probs [D, V] -> tree -> compile -> one verify forward -> walk -> commit -> yield tokens.

The drafter is pluggable (`Drafter`): the DFlash drafter (`DFlashDrafter`) or, for tests and demos,
`OracleNoiseDrafter` built from the target's own next-token distributions plus noise.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn

from ddtree import tree as dtree
from ddtree.acceptance import Decoding, RunningRules, SamplerRules, pick_token
from ddtree.config import DDTreeConfig, HybridMode
from ddtree.metrics import MetricsLog
from ddtree.modes import Mode
from ddtree.policy import (
    CHAIN,
    Decision,
    PolicyConfig,
    PolicyMode,
    Shape,
    ShapePolicy,
    candidate_shapes,
    counterfactual_accepts,
)
from ddtree.stats import RoundStats, round_stats
from ddtree.verify import TargetRunner

# --------------------------------------------------------------------------------------------------------
# Drafters
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftRequest:
    committed: Sequence[int]  # every token whose state is in the target cache (prompt + accepted), in order
    new_features: Tensor | None  # [t, F] target features of the tokens committed since the last call
    bonus_token: int  # the next root: committed, not yet run through the target


class Drafter(Protocol):
    block_size: int  # drafted depth D = block_size - 1
    feature_layers: tuple[int, ...]  # target layers it reads (hidden_states[i + 1]); () = none

    def reset(self) -> None:
        """Start a new sequence."""

    def draft(self, request: DraftRequest) -> Tensor:
        """Log-probs [D, V] float32, row d-1 = the drafter's distribution for depth d after the bonus token."""
        ...


class DFlashDrafter:
    """`ddtree.drafter.DFlashDraftModel` behind the Drafter protocol, with its context K/V cached."""

    def __init__(self, model: Any, target: Any) -> None:
        self.model = model
        self.target = target
        self.block_size = int(model.block_size)
        self.feature_layers = tuple(int(i) for i in model.target_layer_ids)
        self._ctx: Any = None

    def reset(self) -> None:
        self._ctx = self.model.new_context()

    @torch.no_grad()
    def draft(self, request: DraftRequest) -> Tensor:
        if self._ctx is None:
            self.reset()
        if request.new_features is not None:
            self.model.extend_context(self._ctx, request.new_features[None])  # [1, t, F]
        dev = next(self.target.parameters()).device
        bonus = torch.tensor([request.bonus_token], device=dev)  # [1]
        lp: Tensor = self.model.draft_logprobs_cached(
            self._ctx, bonus, self.target.get_input_embeddings(), self.target.lm_head
        )  # [1, D, V]
        return lp[0]


class OracleNoiseDrafter:
    """A drafter that knows the target: row d is log_softmax((target logits at depth d + noise * Gumbel) / temp),
    where depth d follows the target's own greedy continuation of the bonus token. A temp below 1 makes the
    drafter confident (deep trees) even on a flat random target.

    Small noise gives long acceptance runs; noise comparable to the target's logit gaps makes the noisy argmax
    (the spine) miss while the target's choice stays in the top-k, so off-spine acceptances happen. For tests
    and demos. It keeps the greedy trajectory it computed (`lookahead` extra steps): while the committed
    tokens follow it (greedy decoding), later rounds reuse it instead of running the target again.
    """

    def __init__(
        self,
        target: nn.Module,
        block_size: int,
        noise: float,
        seed: int = 0,
        lookahead: int = 0,
        temp: float = 1.0,
    ) -> None:
        self.target = target
        self.block_size = block_size
        self.feature_layers: tuple[int, ...] = ()
        self.noise = noise
        self.seed = seed
        self.lookahead = lookahead
        self.temp = temp
        self._gen = torch.Generator().manual_seed(seed)
        self._tokens: list[int] = []  # greedy trajectory
        self._logits: list[Tensor] = []  # _logits[i]: [V] target logits after _tokens[: i + 1]

    def reset(self) -> None:
        # the trajectory is a cache keyed by its own tokens, valid across sequences: keep it
        self._gen = torch.Generator().manual_seed(self.seed)
        self._fresh = True

    @torch.no_grad()
    def _trajectory(self, seq: list[int], steps: int) -> list[Tensor]:
        """Target logits after seq and after each of the next steps - 1 greedy tokens: steps x [V]."""
        n = len(seq)
        if self._tokens[:n] != seq or len(self._logits) < n - 1 + steps:
            runner = TargetRunner(self.target)
            logits = list(runner.prefill(seq).logits.cpu())
            tokens = list(seq)
            # look ahead once per sequence: later misses (sampling, unsafe) would waste it every round
            extra, self._fresh = (self.lookahead if self._fresh else 0), False
            for _ in range(steps - 1 + extra):
                tokens.append(int(logits[-1].argmax()))
                logits.append(runner.decode(tokens[-1]).logits[-1].cpu())
            self._tokens, self._logits = tokens, logits
        return self._logits[n - 1 : n - 1 + steps]

    def draft(self, request: DraftRequest) -> Tensor:
        rows = []
        for logits in self._trajectory([*request.committed, request.bonus_token], self.block_size - 1):
            gumbel = -torch.log(-torch.log(torch.rand(logits.shape, generator=self._gen).clamp_min(1e-20)))
            rows.append(torch.log_softmax((logits + self.noise * gumbel) / self.temp, dim=-1))
        dev = next(self.target.parameters()).device
        return torch.stack(rows).to(dev)  # [D, V]


# --------------------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    tokens: list[int]
    finish_reason: Literal["stop", "length"]
    rounds: int  # verify rounds (speculative modes) or decode steps (baseline), the prefill excluded
    accept_lengths: list[int]  # committed tokens per round incl. the bonus token


@dataclass
class _Output:
    """Stop/length bookkeeping shared by every mode."""

    max_new_tokens: int
    stop: frozenset[int]
    produced: int = 0
    finish: Literal["stop", "length"] | None = None

    def take(self, tokens: list[int]) -> list[int]:
        out: list[int] = []
        for t in tokens:
            if self.produced >= self.max_new_tokens:
                break
            out.append(t)
            self.produced += 1
            if t in self.stop:
                self.finish = "stop"
                return out
        if self.produced >= self.max_new_tokens:
            self.finish = "length"
        return out


class ReferenceEngine:
    def __init__(
        self,
        model: nn.Module,
        mode: Mode | str,
        drafter: Drafter | None = None,
        ddtree: DDTreeConfig | None = None,
        tokenizer: Any = None,
        policy: ShapePolicy | None = None,
    ) -> None:
        """`policy`: the tree mode's shape policy; by default one built from `ddtree.policy` (None when off)."""
        self.model = model.eval()
        self.mode = Mode(mode)
        self.tokenizer = tokenizer
        if self.mode.spec.drafts and drafter is None:
            raise ValueError(f"mode {self.mode.value} needs a drafter")
        self.drafter = drafter
        self.ddtree = _ddtree_config(self.mode, ddtree)
        has_gdn = TargetRunner(model).gdn_layers != []
        unsafe = self.mode.spec.verifies_tree and self.ddtree is not None and self.ddtree.allow_hybrid_unsafe
        self.hybrid: str = (HybridMode.NONE if not has_gdn else HybridMode.UNSAFE if unsafe else HybridMode.EXACT).value
        self.runner = TargetRunner(
            model,
            feature_layers=drafter.feature_layers if drafter is not None else (),
            hybrid_mode=HybridMode(self.hybrid),
        )
        self.last_stats: list[RoundStats] = []  # per-round stats of the latest generation (spec modes)
        self.policy = policy if policy is not None else _default_policy(self.mode, self.ddtree)
        self.last_shapes: list[Shape] = []  # per-round shape of the latest generation (tree mode with a policy)
        self.last_rules: RunningRules | None = None  # the latest generation's output as its rules count it
        self.metrics: MetricsLog | None = None
        if self.mode.spec.builds_tree and self.ddtree is not None and drafter is not None:
            self.metrics = MetricsLog(self.ddtree, drafter.block_size, self.hybrid, policy=self.policy)
            self.metrics.start()

    @classmethod
    def load(
        cls,
        target_path: str,
        draft_path: str | None,
        mode: str,
        ddtree: DDTreeConfig | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        tokenizer_path: str | None = None,
    ) -> ReferenceEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch_dtype = getattr(torch, dtype)
        auto_model: Any = AutoModelForCausalLM
        model = auto_model.from_pretrained(target_path, dtype=torch_dtype, local_files_only=True)
        model = model.to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or target_path, local_files_only=True)
        drafter: Drafter | None = None
        if Mode(mode).spec.drafts:
            if draft_path is None:
                raise ValueError(f"mode {mode} needs a draft model path")
            from ddtree.drafter import load_drafter

            drafter = DFlashDrafter(load_drafter(draft_path, device=device, dtype=torch_dtype), model)
        return cls(model, mode, drafter=drafter, ddtree=ddtree, tokenizer=tokenizer)

    # ---- public API ------------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_token_ids: Collection[int] = (),
        decoding: Decoding | None = None,
    ) -> GenerationResult:
        """`decoding` (top-k, top-p, min-p, penalties, min_new_tokens, logit_bias) replaces `temperature`."""
        tokens: list[int] = []
        accept: list[int] = []
        out = _Output(max_new_tokens, frozenset(stop_token_ids))
        decoding = decoding or Decoding(SamplerRules(temperature=temperature))
        for chunk in self._stream(prompt_ids, decoding, seed, out, accept):
            tokens.extend(chunk)
        return GenerationResult(
            tokens=tokens,
            finish_reason=out.finish or "length",
            rounds=len(accept),
            accept_lengths=accept,
        )

    def stream(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_token_ids: Collection[int] = (),
        decoding: Decoding | None = None,
    ) -> Iterator[list[int]]:
        """Yields the tokens committed each round (the first chunk is the prefill's token)."""
        out = _Output(max_new_tokens, frozenset(stop_token_ids))
        yield from self._stream(prompt_ids, decoding or Decoding(SamplerRules(temperature=temperature)), seed, out, [])

    # ---- loops -----------------------------------------------------------------------------------------
    def _stream(
        self, prompt_ids: list[int], decoding: Decoding, seed: int | None, out: _Output, accept: list[int]
    ) -> Iterator[list[int]]:
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if out.max_new_tokens <= 0:
            return
        gen = torch.Generator()
        if seed is not None:
            gen.manual_seed(seed)
        else:
            gen.seed()
        self.last_stats, self.last_shapes = [], []
        step = self.runner.prefill(prompt_ids)
        # the rules' view of the output: counted as it is committed, never recounted (None: temperature only)
        rules = None
        if not decoding.temperature_only:
            rules = RunningRules(decoding.rules, int(step.logits.shape[-1]), step.logits.device)
        self.last_rules = rules
        bonus = _choose(step.logits[-1], decoding, rules, gen)
        first = out.take([bonus])
        yield first
        if out.finish:
            return
        if not self.mode.spec.drafts:
            rounds = self._baseline_rounds(bonus, decoding, rules, gen)
        else:
            assert self.drafter is not None
            self.drafter.reset()
            rounds = self._spec_rounds(list(prompt_ids), step.features, bonus, decoding, rules, gen)
        for chunk in rounds:
            accept.append(len(chunk))
            taken = out.take(chunk)
            yield taken
            if out.finish:
                return

    def _baseline_rounds(
        self, token: int, decoding: Decoding, rules: RunningRules | None, gen: torch.Generator
    ) -> Iterator[list[int]]:
        while True:
            logits = self.runner.decode(token).logits[-1]  # [V]
            token = _choose(logits, decoding, rules, gen)
            yield [token]

    def _spec_rounds(
        self,
        committed: list[int],
        features: Tensor | None,
        bonus: int,
        decoding: Decoding,
        rules: RunningRules | None,
        gen: torch.Generator,
    ) -> Iterator[list[int]]:
        assert self.drafter is not None
        depth = self.drafter.block_size - 1
        # a round's observation waits for the next round's start: what the caller did in between is its gap
        held: _HeldRound | None = None
        try:
            while True:
                t0 = self._now()
                if held is not None:  # before the decision, as when rounds were observed at once
                    self._observe(held, depth, gap_ms=(t0 - held.end) * 1e3)
                    held = None
                decision = self.policy.decide(1) if self.policy is not None else None
                lp = self.drafter.draft(DraftRequest(committed, features, bonus))  # [D, V]
                t1 = self._now()
                tree, stats_tree = self._make_tree(lp, bonus, depth, decision.shape if decision else None)
                inputs = dtree.compile_tree(tree, self.runner.prefix_len)
                t2 = self._now()
                verified = self.runner.verify(inputs)  # logits: [N, V]
                t3 = self._now()
                walk = _walk(tree, verified.logits, decoding, rules, gen)
                self.runner.commit(walk.accepted)
                t4 = self._now()
                path = list(walk.accepted)
                committed.extend(tree.tokens[path].tolist())
                features = verified.features[path] if verified.features is not None else None  # [A, F]
                bonus = walk.bonus_token
                self._record(stats_tree, tree, walk, (t0, t1, t2, t3, t4))
                if decision is not None:
                    self.last_shapes.append(decision.shape)
                    held = _HeldRound(decision, tree, walk, cost_ms=(t4 - t0) * 1e3, end=t4)
                yield [*tree.tokens[path[1:]].tolist(), bonus]
        finally:  # the request's last round (or the caller stopped): no next round, no gap
            if held is not None:
                self._observe(held, depth, gap_ms=None)

    def _make_tree(
        self, lp: Tensor, bonus: int, depth: int, shape: Shape | None = None
    ) -> tuple[dtree.DraftTree, dtree.DraftTree]:
        """(tree to verify, tree whose shape is reported). `shape`: the policy's choice (tree mode)."""
        if not self.mode.spec.builds_tree or shape == CHAIN:
            spine = dtree.spine_tree(lp, bonus, depth)
            return spine, spine
        assert self.ddtree is not None
        budget = shape.budget if shape is not None else self.ddtree.budget
        full = dtree.build_tree(lp, bonus, budget, self.ddtree.topk)
        if not self.mode.spec.verifies_tree:  # shadow: the spine is verified, the tree reported
            return dtree.spine_tree(lp, bonus, depth), full
        return full, full

    def _record(
        self,
        stats_tree: dtree.DraftTree,
        verified: dtree.DraftTree,
        walk: dtree.WalkResult,
        t: tuple[float, float, float, float, float],
    ) -> None:
        ms = {"draft": (t[1] - t[0]) * 1e3, "build": (t[2] - t[1]) * 1e3, "verify": (t[3] - t[2]) * 1e3}
        ms["commit"] = (t[4] - t[3]) * 1e3
        off_spine = dtree.is_off_spine(verified, walk.accepted)
        (stats,) = round_stats([len(walk.accepted)], [dtree.tree_shape(stats_tree)], [off_spine], ms)
        self.last_stats.append(stats)
        if self.metrics is not None:
            self.metrics.record(stats)

    def _observe(self, held: _HeldRound, depth: int, gap_ms: float | None) -> None:
        """Feed the policy what a round accepted (and what the shapes it dominates would have), its cost and the
        gap after it. At batch size 1 on the host these are known by the next round's start; the SGLang worker
        feeds its own later."""
        assert self.policy is not None
        accepted = counterfactual_accepts(
            held.tree.parents.tolist(), held.walk.accepted, held.decision.shape, self.policy.config.shapes, depth
        )
        accepted_f = {s: float(a) for s, a in accepted.items()}
        self.policy.observe(held.decision.round_id, accepted=accepted_f, cost_ms=held.cost_ms, gap_ms=gap_ms)

    def _now(self) -> float:
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)
        return time.perf_counter()


def _choose(logits: Tensor, decoding: Decoding, rules: RunningRules | None, gen: torch.Generator) -> int:
    """The target's token after the output `rules` holds, committed to it (logits: [V]; rules: None when the
    decoding is temperature only)."""
    if rules is None:
        return dtree.sample_token(logits, decoding.sampler.temperature, gen)
    token = pick_token(rules.adjust(logits.to(torch.float32)), decoding.sampler, gen)
    rules.commit([token])
    return token


def _walk(
    tree: dtree.DraftTree, logits: Tensor, decoding: Decoding, rules: RunningRules | None, gen: torch.Generator
) -> dtree.WalkResult:
    """The round's walk. `rules` holds the output up to the tree's root (the root is the newest output token); a
    node's rules read that and the node's path (ddtree.acceptance), so each accepted draft is committed to it as
    the walk accepts it, and the bonus last: the round's tokens, counted once."""
    if rules is None:
        return dtree.walk_tree(tree, logits, decoding.sampler.temperature, gen)
    tokens = tree.tokens.tolist()

    def choose(path: list[int]) -> int:  # path[-1] was accepted: the previous choice was its token
        if len(path) > 1:
            rules.commit([tokens[path[-1]]])
        return pick_token(rules.adjust(logits[path[-1]].to(torch.float32)), decoding.sampler, gen)

    walk = dtree.walk_visiting(tree.parents.tolist(), tokens, choose)
    rules.commit([walk.bonus_token])
    return walk


@dataclass(frozen=True)
class _HeldRound:
    """A policy round's results, held until the next round starts (its gap) or the request ends."""

    decision: Decision
    tree: dtree.DraftTree
    walk: dtree.WalkResult
    cost_ms: float
    end: float  # the host clock at its end (s)


def policy_shapes(config: DDTreeConfig) -> tuple[Shape, ...]:
    """The policy's candidates: the configured tree, two halvings, the chain, and a pinned shape if another."""
    shapes = candidate_shapes(config.budget)
    pin = config.policy.pinned
    return shapes if pin is None or pin in shapes else (*shapes[:-1], pin, CHAIN)


def _default_policy(mode: Mode, ddtree: DDTreeConfig | None) -> ShapePolicy | None:
    """The tree mode's policy from `ddtree.policy`; None when off (and in every other mode)."""
    if not mode.spec.verifies_tree or ddtree is None or ddtree.policy.mode is PolicyMode.OFF:
        return None
    return ShapePolicy(PolicyConfig(shapes=policy_shapes(ddtree)), ddtree.policy)


def _ddtree_config(mode: Mode, ddtree: DDTreeConfig | None) -> DDTreeConfig | None:
    """A mode that builds trees (shadow, tree) always has a config whose `verify` is the mode; the others none."""
    if not mode.spec.builds_tree:
        return None
    if ddtree is None:
        return DDTreeConfig(verify=mode)
    return dataclasses.replace(ddtree, verify=mode)
