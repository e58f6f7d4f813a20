"""Lossless: greedy linear, shadow and tree == baseline, token for token, on a dense and a hybrid target.

The drafter knows the target (its next-token distributions along the target's greedy continuation) plus
Gumbel noise on the logits: long acceptance runs happen, and the noisy argmax (the spine) often misses while
the target's token is still in the top-k, so off-spine acceptances happen. Both are asserted, so the check
is not hollow.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from ddtree.acceptance import Decoding, RequestRules, SamplerRules
from ddtree.config import DDTreeConfig
from ddtree.engine import Mode, OracleNoiseDrafter, ReferenceEngine
from tiny_targets import dense_target, hybrid_target, one_thread

pytestmark = [pytest.mark.runtime, pytest.mark.usefixtures("one_thread")]
__all__ = ["one_thread"]  # the fixture, imported for pytest

VOCAB = 64
BLOCK = 5  # drafted depth 4
NEW_TOKENS = 20
CASES = [(p, s) for p in range(10) for s in range(2)]  # 20 prompts x seeds (the seed drives the drafter noise)
CFG = DDTreeConfig(budget=12, topk=3, log_interval=10)


def _drafter(target: torch.nn.Module, seed: int = 0) -> OracleNoiseDrafter:
    # noise ~ the tiny targets' top-2 logit gaps; temp 0.1 makes the drafter confident (deep trees)
    return OracleNoiseDrafter(target, BLOCK, noise=0.05, seed=seed, lookahead=NEW_TOKENS, temp=0.1)


def _prompt(i: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, VOCAB, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def target(request: pytest.FixtureRequest) -> torch.nn.Module:
    return dense_target(VOCAB, seed=0) if request.param == "dense" else hybrid_target(VOCAB, seed=0)


def test_greedy_modes_equal_baseline(target: torch.nn.Module) -> None:
    baseline = ReferenceEngine(target, Mode.BASELINE)
    drafter = _drafter(target)  # shared: its cached greedy trajectory serves all three modes
    engines = {
        mode: ReferenceEngine(target, mode, drafter=drafter, ddtree=CFG)
        for mode in (Mode.LINEAR, Mode.SHADOW, Mode.TREE)
    }
    stats: dict[Mode, list] = {m: [] for m in engines}
    wants: dict[int, list[int]] = {}  # the baseline once per prompt (the seed only drives the drafter)
    for p, seed in CASES:
        prompt = _prompt(p)
        if p not in wants:
            wants[p] = baseline.generate(prompt, NEW_TOKENS).tokens
        want = wants[p]
        assert len(want) == NEW_TOKENS
        drafter.seed = seed
        for mode, engine in engines.items():
            got = engine.generate(prompt, NEW_TOKENS)
            assert got.tokens == want, f"{mode.value} diverged on prompt {p} seed {seed}"
            stats[mode].extend(engine.last_stats)
    tree_rounds = stats[Mode.TREE]
    off_spine = sum(r.off_spine for r in tree_rounds)
    full_depth = sum(r.accepted_len == BLOCK for r in tree_rounds)
    taus = {m.value: sum(r.accepted_len for r in s) / len(s) for m, s in stats.items()}
    print(
        f"\nrounds={len(tree_rounds)} tau={taus} tree off_spine_rounds={off_spine} "
        f"full_depth_rounds={full_depth} mean_nodes={sum(r.nodes for r in tree_rounds) / len(tree_rounds):.1f}"
    )
    assert off_spine >= 5
    assert full_depth >= 5
    assert taus["tree"] > taus["linear"]  # the tree catches the spine's misses
    assert taus["shadow"] == taus["linear"]  # shadow verifies the spine: identical rounds
    assert not any(r.off_spine for r in stats[Mode.SHADOW])


def test_unsafe_flat_order_is_not_lossless_on_the_hybrid_target() -> None:
    """What the seed shipped: the flat-order tree verify on a hybrid target changes the output."""
    target = hybrid_target(VOCAB, seed=0)
    drafter = _drafter(target)
    unsafe_cfg = DDTreeConfig(budget=12, topk=3, allow_hybrid_unsafe=True)
    baseline = ReferenceEngine(target, Mode.BASELINE)
    unsafe = ReferenceEngine(target, Mode.TREE, drafter=drafter, ddtree=unsafe_cfg)
    diverged = 0
    for p, seed in CASES[:5]:
        drafter.seed = seed
        want = baseline.generate(_prompt(p), NEW_TOKENS).tokens
        diverged += unsafe.generate(_prompt(p), NEW_TOKENS).tokens != want
    print(f"\nunsafe tree verify: {diverged}/5 greedy outputs differ from baseline")
    assert diverged >= 2


def test_stop_and_length_cut_inside_a_round() -> None:
    target = dense_target(VOCAB, seed=0)
    baseline = ReferenceEngine(target, Mode.BASELINE)
    tree = ReferenceEngine(target, Mode.TREE, drafter=_drafter(target), ddtree=CFG)
    prompt = _prompt(3)
    full = baseline.generate(prompt, NEW_TOKENS).tokens
    stop = full[7]
    cut = full[: full.index(stop) + 1]
    for engine in (baseline, tree):
        res = engine.generate(prompt, NEW_TOKENS, stop_token_ids=[stop])
        assert (res.tokens, res.finish_reason) == (cut, "stop")
        res = engine.generate(prompt, 6)
        assert (res.tokens, res.finish_reason) == (full[:6], "length")
        chunks = list(engine.stream(prompt, 6))
        assert [t for c in chunks for t in c] == full[:6]
        assert chunks[0] == full[:1]  # the prefill's token comes first, on its own
    assert max(len(c) for c in tree.stream(prompt, NEW_TOKENS)) > 1  # rounds commit several tokens


def test_tree_mode_emits_ddtree_lines(caplog: pytest.LogCaptureFixture) -> None:
    target = dense_target(VOCAB, seed=0)
    with caplog.at_level(logging.INFO, logger="ddtree"):
        engine = ReferenceEngine(target, Mode.TREE, drafter=_drafter(target), ddtree=CFG)
        engine.generate(_prompt(0), 40)
    lines = [r.getMessage() for r in caplog.records if r.name == "ddtree"]
    assert lines[0].startswith("DDTREE init mode=tree budget=12 topk=3 block=5 hybrid=none")
    assert lines[1].startswith("DDTREE verify completed accept_length=")
    assert any(line.startswith("DDTREE metrics rounds=10 ") for line in lines)


def test_unsafe_is_explicit_and_loud() -> None:
    target = hybrid_target(VOCAB, seed=0)
    drafter = _drafter(target)
    assert ReferenceEngine(target, Mode.TREE, drafter=drafter, ddtree=CFG).hybrid == "exact"
    unsafe_cfg = DDTreeConfig(budget=12, topk=3, log_interval=1, allow_hybrid_unsafe=True)
    engine = ReferenceEngine(target, Mode.TREE, drafter=drafter, ddtree=unsafe_cfg)
    assert engine.hybrid == "unsafe"
    assert engine.runner.hybrid_mode.value == "unsafe"
    # the flag changes nothing for chain verifies (a chain has no siblings)
    assert ReferenceEngine(target, Mode.SHADOW, drafter=drafter, ddtree=unsafe_cfg).hybrid == "exact"


@pytest.mark.parametrize("arch", ["tiny_dense", "tiny_hybrid"])
def test_loaded_tiny_models_with_dflash_drafter_are_lossless(arch: str, request: pytest.FixtureRequest) -> None:
    """ReferenceEngine.load end to end: target + tokenizer + distilled DFlash drafter from disk."""
    root = request.getfixturevalue(arch)
    target, draft = str(root / "target"), str(root / "draft")
    baseline = ReferenceEngine.load(target, None, "baseline")
    cfg = DDTreeConfig(budget=16, topk=4)
    engines = {m: ReferenceEngine.load(target, draft, m, ddtree=cfg) for m in ("linear", "shadow", "tree")}
    tok = baseline.tokenizer
    heldout = json.loads((root / "build.json").read_text())["heldout_prompts"][:4]  # prompts it never saw
    stop = [tok.convert_tokens_to_ids("<|im_end|>")]
    taus: dict[str, list[int]] = {m: [] for m in engines}
    for user in heldout:
        text = tok.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        ids = list(tok.encode(text))
        want = baseline.generate(ids, 32, stop_token_ids=stop).tokens
        for mode, engine in engines.items():
            got = engine.generate(ids, 32, stop_token_ids=stop)
            assert got.tokens == want, f"{arch} {mode} diverged on {user!r}"
            taus[mode].extend(got.accept_lengths)
    summary = {m: round(sum(v) / len(v), 2) for m, v in taus.items()}
    print(f"\n{arch}: tau {summary} hybrid={engines['tree'].hybrid}")
    assert engines["tree"].hybrid == ("exact" if arch == "tiny_hybrid" else "none")
    assert summary["tree"] >= summary["linear"] > 1.5  # the distilled drafter really drafts


# Every request kind on the reference engine (ddtree.acceptance): the logit rules read the output so far (a tree
# node's own path included) and seeded draws come one per committed token, so each mode gives the baseline's
# tokens exactly, sampled ones included.
KINDS = {
    "logit_bias": Decoding(rules=RequestRules(logit_bias={5: -100.0, 9: 3.0})),
    "frequency": Decoding(rules=RequestRules(frequency_penalty=1.5)),
    "presence+repetition": Decoding(rules=RequestRules(presence_penalty=0.8, repetition_penalty=1.4)),
    "min_new_tokens": Decoding(
        rules=RequestRules(min_new_tokens=12, stop_token_ids=frozenset({3}), logit_bias={3: 4.0})
    ),
    "sampled T=0.7": Decoding(SamplerRules(temperature=0.7)),
    "sampled T=1 top-k top-p": Decoding(SamplerRules(temperature=1.0, top_k=8, top_p=0.9)),
    "sampled T=1 min-p, penalties": Decoding(
        SamplerRules(temperature=1.0, min_p=0.1), RequestRules(frequency_penalty=0.5, logit_bias={5: -100.0})
    ),
}


# On the hybrid target, three kinds: the rules are the dense target's code; what the hybrid adds is the tree verify
# through recurrent states, which penalties that read the output so far, a minimum length and a seeded draw with a
# bias all pass through.
HYBRID_KINDS = ("presence+repetition", "min_new_tokens", "sampled T=1 min-p, penalties")


def test_every_request_kind_equals_the_baseline_in_every_mode(
    target: torch.nn.Module, request: pytest.FixtureRequest
) -> None:
    hybrid = request.node.callspec.params["target"] == "hybrid"
    kinds = {name: KINDS[name] for name in HYBRID_KINDS} if hybrid else KINDS
    baseline = ReferenceEngine(target, Mode.BASELINE)
    drafter = _drafter(target)
    engines = {mode: ReferenceEngine(target, mode, drafter=drafter, ddtree=CFG) for mode in (Mode.LINEAR, Mode.TREE)}
    off_spine = 0
    plain = {p: baseline.generate(_prompt(p), NEW_TOKENS, seed=p).tokens for p in range(2)}
    for name, decoding in kinds.items():
        for p in range(2):
            prompt = _prompt(p)
            want = baseline.generate(prompt, NEW_TOKENS, seed=p, decoding=decoding).tokens
            assert want != plain[p], f"{name}: the rule changes nothing on prompt {p}"
            for mode, engine in engines.items():
                got = engine.generate(prompt, NEW_TOKENS, seed=p, decoding=decoding)
                assert got.tokens == want, f"{name}, {mode.value}, prompt {p}: {got.tokens} != {want}"
                off_spine += sum(r.off_spine for r in engine.last_stats) if mode is Mode.TREE else 0
    assert off_spine > 0  # the tree accepted beyond its spine while rules applied
    banned = baseline.generate(_prompt(0), NEW_TOKENS, decoding=KINDS["logit_bias"]).tokens
    assert 5 not in banned
    early = baseline.generate(_prompt(0), NEW_TOKENS, decoding=KINDS["min_new_tokens"]).tokens
    assert 3 not in early[:12]
