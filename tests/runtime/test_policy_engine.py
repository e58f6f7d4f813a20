"""The reference engine's tree mode with the shape policy: greedy tokens equal the baseline's while the policy
switches shape mid-request (forced by synthetic costs), on a dense and a hybrid tiny target; the metrics line
carries the policy's keys; DDTREE_POLICY reaches the engine."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest
import torch
from ddtree.config import DDTreeConfig
from ddtree.engine import Mode, OracleNoiseDrafter, ReferenceEngine, policy_shapes
from ddtree.policy import CHAIN, PolicyConfig, PolicyMode, PolicySetting, Shape, ShapePolicy
from tiny_targets import dense_target, hybrid_target, one_thread

pytestmark = [pytest.mark.runtime, pytest.mark.usefixtures("one_thread")]
__all__ = ["one_thread"]

VOCAB = 64
BLOCK = 5
NEW_TOKENS = 80
CFG = DDTreeConfig(budget=12, topk=3, log_interval=8, policy=PolicySetting(PolicyMode.AUTO))


class PhasedCosts(ShapePolicy):
    """The real policy, fed synthetic round costs instead of the host's timings: the chain is cheap for the
    first `flip` rounds, then the trees are. Everything else (acceptances, decisions) is the real thing."""

    flip = 10

    def observe(
        self,
        round_id: int,
        accepted: Mapping[Shape, float] | None = None,
        cost_ms: float | None = None,
        gap_ms: float | None = None,
    ) -> bool:
        shape = self._pending[round_id].shape if round_id in self._pending else CHAIN
        cheap = shape.is_chain == (round_id < self.flip)
        return super().observe(round_id, accepted=accepted, cost_ms=1.0 if cheap else 40.0)  # no gap: synthetic


def _drafter(target: torch.nn.Module, seed: int) -> OracleNoiseDrafter:
    return OracleNoiseDrafter(target, BLOCK, noise=0.05, seed=seed, lookahead=NEW_TOKENS, temp=0.1)


def _prompt(i: int) -> list[int]:
    g = torch.Generator().manual_seed(2000 + i)
    return torch.randint(0, VOCAB, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()


@pytest.mark.parametrize("arch", ["dense", "hybrid"])
def test_tokens_equal_baseline_while_the_policy_switches_mid_request(arch: str) -> None:
    target = dense_target(VOCAB, seed=0) if arch == "dense" else hybrid_target(VOCAB, seed=0)
    baseline = ReferenceEngine(target, Mode.BASELINE)
    for p in range(3):
        prompt = _prompt(p)
        want = baseline.generate(prompt, NEW_TOKENS).tokens
        config = PolicyConfig(shapes=policy_shapes(CFG), dwell=3, first_dwell=3, explore=0.25, warmup_every=2, seed=p)
        policy = PhasedCosts(config, CFG.policy)
        engine = ReferenceEngine(target, Mode.TREE, drafter=_drafter(target, p), ddtree=CFG, policy=policy)
        got = engine.generate(prompt, NEW_TOKENS)
        assert got.tokens == want, f"{arch} prompt {p} diverged"
        shapes = engine.last_shapes
        assert len(shapes) == got.rounds >= 16
        # the current shape went tree -> chain (cheap early) -> a tree again (cheap later), in one request
        first_chain = shapes.index(CHAIN)
        assert any(not s.is_chain for s in shapes[first_chain:])
        assert policy.snapshot().switches >= 2, shapes
        assert [r.nodes for r in engine.last_stats if r.width == 1 and r.nodes == BLOCK - 1]  # chain rounds ran


def test_metrics_line_carries_the_policy(caplog: pytest.LogCaptureFixture) -> None:
    target = dense_target(VOCAB, seed=0)
    with caplog.at_level(logging.INFO, logger="ddtree"):
        engine = ReferenceEngine(target, Mode.TREE, drafter=_drafter(target, 0), ddtree=CFG)
        engine.generate(_prompt(0), NEW_TOKENS)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DDTREE metrics")]
    assert lines
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[2:])
    assert fields["policy"] == "auto"
    assert fields["choice"].startswith("1-1:")
    assert set(fields["est"].split(",")[0].split(":")) & {"tree12"}
    assert list(fields)[-7:] == ["policy", "shape", "choice", "est", "switches", "probes", "gap"]  # appended last


def test_policy_off_and_pinned_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    target = dense_target(VOCAB, seed=0)
    off = DDTreeConfig.from_env({"DDTREE_BUDGET": "12", "DDTREE_TOPK": "3"})
    assert ReferenceEngine(target, Mode.TREE, drafter=_drafter(target, 0), ddtree=off).policy is None
    pinned = DDTreeConfig.from_env({"DDTREE_BUDGET": "12", "DDTREE_TOPK": "3", "DDTREE_POLICY": "tree5"})
    engine = ReferenceEngine(target, Mode.TREE, drafter=_drafter(target, 0), ddtree=pinned)
    engine.generate(_prompt(1), 24)
    assert set(engine.last_shapes) == {Shape(5)}
    assert max(r.nodes for r in engine.last_stats) <= 5
    # linear and shadow never take a policy
    assert ReferenceEngine(target, Mode.SHADOW, drafter=_drafter(target, 0), ddtree=pinned).policy is None


@pytest.mark.parametrize(
    ("value", "message"),
    [("tree13", "N <= DDTREE_BUDGET=12"), ("bushy", "expected off, auto, chain or tree<N>")],
)
def test_bad_policy_values_raise_one_line(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DDTreeConfig.from_env({"DDTREE_BUDGET": "12", "DDTREE_POLICY": value})
