"""Tiny models: the byte tokenizer and chat template, the built folders, and the drafter's acceptance length.

TAU_MIN is the documented floor for the mean acceptance length (committed tokens per round, bonus included)
of greedy chain verify (`linear`) on chat prompts never seen in training; block_size 8 caps it at 8.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ddtree.drafter import load_drafter
from ddtree.tiny import corpus
from ddtree.tiny.chain import greedy_baseline, greedy_chain
from ddtree.tiny.tokenizer import IM_END, MASK, TOKEN_IDS, build_tokenizer
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

pytestmark = pytest.mark.runtime

TAU_MIN = 2.0
EVAL_SEED = 4242  # not the build's own evaluation seed: these prompts are new to the build, too
EVAL_PROMPTS = 9
EVAL_NEW_TOKENS = 48
ARCH_FIXTURES = ("tiny_dense", "tiny_hybrid")
TOKENIZER = build_tokenizer()


# --- tokenizer -------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_tokenizer_is_bytes(text: str) -> None:
    assume(not any(special in text for special in TOKEN_IDS))  # those map to their own ids (tested below)
    ids = TOKENIZER.encode(text)
    assert ids == list(text.encode("utf-8"))  # id b is byte b, no BOS, no merges
    assert TOKENIZER.decode(ids) == text


def test_every_byte_round_trips() -> None:
    ids = list(range(256))
    # decode() yields text (complete UTF-8 only), so check the byte alphabet at the token level: id b is the
    # byte-level symbol of byte b, and those symbols map back to the same ids
    tokens = TOKENIZER.convert_ids_to_tokens(ids)
    byte_to_char = bytes_to_unicode()
    assert tokens == [byte_to_char[b] for b in ids]
    assert TOKENIZER.convert_tokens_to_ids(tokens) == ids
    assert [TOKENIZER.decode([b]) for b in range(128)] == [chr(b) for b in range(128)]
    assert TOKENIZER.decode(list("héllo 🤖\n\t".encode())) == "héllo 🤖\n\t"


def test_special_tokens() -> None:
    assert TOKEN_IDS == {
        "<|endoftext|>": 256,
        "<|im_start|>": 257,
        "<|im_end|>": 258,
        "<think>": 259,
        "</think>": 260,
        "<|MASK|>": 261,
    }
    assert TOKENIZER.encode("a<|im_end|><think>b</think>") == [97, 258, 259, 98, 260]
    assert (TOKENIZER.eos_token_id, TOKENIZER.pad_token_id, TOKENIZER.mask_token_id) == (258, 256, 261)
    assert TOKENIZER.decode([257, 259, 104, 260, 258]) == "<|im_start|><think>h</think><|im_end|>"
    assert TOKENIZER.decode([257, 104, 258], skip_special_tokens=True) == "h"


def test_chat_template_thinking_on_and_off() -> None:
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "count from 1 to 3"},
    ]
    head = (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\ncount from 1 to 3<|im_end|>\n"
    )

    def render(**kw: object) -> str:
        return str(TOKENIZER.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw))

    assert render(enable_thinking=False) == head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert render(enable_thinking=True) == head + "<|im_start|>assistant\n"
    assert render() == head + "<|im_start|>assistant\n"  # thinking is the default, as in Qwen3
    no_gen = TOKENIZER.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert no_gen == head


# --- the built folders -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ARCH_FIXTURES)
def test_tiny_folders_load_with_stock_classes(fixture: str, request: pytest.FixtureRequest) -> None:
    root = Path(request.getfixturevalue(fixture))
    target = AutoModelForCausalLM.from_pretrained(root / "target", local_files_only=True)
    cfg = AutoConfig.from_pretrained(root / "target", local_files_only=True)
    if fixture == "tiny_dense":
        assert type(target).__name__ == "Qwen3ForCausalLM"
    else:
        assert type(target).__name__ == "Qwen3_5ForCausalLM"
        assert cfg.layer_types.count("linear_attention") >= 3
        assert cfg.layer_types.count("full_attention") >= 1
    assert next(target.parameters()).dtype == torch.float32

    tok = AutoTokenizer.from_pretrained(root / "target", local_files_only=True)
    assert tok.encode("ok<|im_end|>") == [111, 107, 258]
    assert len(tok) <= cfg.vocab_size

    drafter = load_drafter(root / "draft")
    assert drafter.mask_token_id == tok.convert_tokens_to_ids(MASK)
    assert drafter.config.hidden_size == cfg.hidden_size
    assert drafter.config.vocab_size == cfg.vocab_size
    assert max(drafter.target_layer_ids) < cfg.num_hidden_layers - 1  # the last HF entry is post-norm
    report = json.loads((root / "build.json").read_text())
    assert report["arch"] == ("qwen3" if fixture == "tiny_dense" else "qwen3_5")


def _eval_prompts(root: Path, tok: object) -> list[list[int]]:
    report = json.loads((root / "build.json").read_text())
    # every prompt of the build's training corpus is excluded
    seen = {s.prompt for s, _ in corpus.training_samples(report["settings"]["corpus_size"], report["seed"])}
    users = corpus.heldout_prompts(EVAL_PROMPTS, EVAL_SEED, seen)
    return [
        list(
            tok.encode(  # type: ignore[attr-defined]
                tok.apply_chat_template(  # type: ignore[attr-defined]
                    [{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True, enable_thinking=False
                )
            )
        )
        for u in users
    ]


@pytest.mark.parametrize("fixture", ARCH_FIXTURES)
def test_heldout_tau_chain_verify(fixture: str, request: pytest.FixtureRequest) -> None:
    """Greedy chain verify with the distilled drafter: lossless, and tau >= TAU_MIN on unseen prompts."""
    root = Path(request.getfixturevalue(fixture))
    target = AutoModelForCausalLM.from_pretrained(root / "target", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(root / "target", local_files_only=True)
    drafter = load_drafter(root / "draft")
    stop = [TOKEN_IDS[IM_END]]
    accepts: list[int] = []
    outputs: set[tuple[int, ...]] = set()
    for prompt in _eval_prompts(root, tok):
        res = greedy_chain(target, drafter, prompt, EVAL_NEW_TOKENS, stop)
        assert res.tokens == greedy_baseline(target, prompt, EVAL_NEW_TOKENS, stop)
        accepts += res.accept_lengths
        outputs.add(tuple(res.tokens))
    tau = sum(accepts) / len(accepts)
    print(f"{fixture}: held-out tau {tau:.2f} over {len(accepts)} rounds, {len(outputs)} distinct outputs")
    assert tau >= TAU_MIN
    assert min(accepts) < drafter.block_size  # the drafter does miss sometimes: acceptance is not saturated
    assert len(outputs) >= 3  # answers depend on the prompt


@pytest.mark.parametrize("fixture", ARCH_FIXTURES)
def test_heldout_tau_through_engine(fixture: str, request: pytest.FixtureRequest) -> None:
    """The same measurement through ddtree.engine (KV-cached target, cached drafter context): linear, tree."""
    engine_mod = pytest.importorskip("ddtree.engine")
    from ddtree.config import DDTreeConfig

    root = Path(request.getfixturevalue(fixture))
    target, draft = str(root / "target"), str(root / "draft")
    baseline = engine_mod.ReferenceEngine.load(target, None, "baseline")
    engines = {
        "linear": engine_mod.ReferenceEngine.load(target, draft, "linear"),
        "tree": engine_mod.ReferenceEngine.load(target, draft, "tree", ddtree=DDTreeConfig(budget=32, topk=8)),
    }
    stop = [TOKEN_IDS[IM_END]]
    accepts: dict[str, list[int]] = {mode: [] for mode in engines}
    for prompt in _eval_prompts(root, baseline.tokenizer):
        expected = baseline.generate(prompt, EVAL_NEW_TOKENS, stop_token_ids=stop).tokens
        for mode, engine in engines.items():
            res = engine.generate(prompt, EVAL_NEW_TOKENS, stop_token_ids=stop)
            assert res.tokens == expected, mode
            accepts[mode] += res.accept_lengths
    tau = {mode: sum(a) / len(a) for mode, a in accepts.items()}
    print(f"{fixture}: engine tau " + " ".join(f"{m}={t:.2f}" for m, t in tau.items()))
    assert tau["linear"] >= TAU_MIN
    assert tau["tree"] >= TAU_MIN
