"""SGLang 0.5.23's real Engine on CPU, end to end: the tiny dense Qwen3 target and its DFlash drafter (the
`tiny_dense` fixture), served by SGLang baseline, DFLASH, and DDTREE in shadow mode (the plugin found through
its entry point with runtime/ on PYTHONPATH, as opsctl deploys it), with the Triton attention backend opsctl
renders (run by Triton's CPU interpreter). Greedy tokens must equal transformers' greedy generate token for
token; the speculative runs must accept more than one token per round; shadow must log its tree statistics.
The hybrid target (`tiny_hybrid`: Gated DeltaNet + attention layers, what ct200's gpu1 serves with DDTREE shadow)
runs baseline, DDTREE shadow and DDTREE tree (exact through the recurrent layers) the same way.

Each mode is one Engine launch, run by the session's engine host (the `sglang_engine` fixture,
tests/runtime/sglang_host.py: SGLang imported once, each launch forked from it); SGLang is never imported into
the pytest process. docs/ci.md, "SGLang's engine on CPU, in CI", lists the stub and patches
(tests/runtime/sglang_engine/) this needs on a CPU and what it does and does not prove.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from ddtree.greedy_check import FP32_TIE_TOLERANCE, GreedyMismatch, compared_length, top2_gaps

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sglang_cpu import sglang_skip_reason  # noqa: E402
from sglang_host import EngineHost  # noqa: E402

sys.path.remove(str(HERE))

# Prompts whose greedy answers have clear margins on both tiny targets (transformers' top-2 logit gap > 0.3 over
# the first 32 tokens, except where noted): SGLang and transformers are two float implementations, compared
# margin-aware (ddtree.greedy_check); on near-ties ("count from 43 to 50": gap 0.011) CPUs differ.
PROMPTS = ["write mul for 4 and 9", "write sub for 7 and 3", "json for carol, age 52, from lima"]
NEW_TOKENS = 32
BASELINE_TOKENS = 16  # plain decode is one interpreted step per token (~1 s each here); the spec runs take 32
DDTREE_BUDGET, DDTREE_TOPK, DRAFT_BLOCK = 16, 4, 8  # DRAFT_BLOCK: the tiny drafter's block size
SHADOW_ENV = {
    "DDTREE_VERIFY": "shadow",
    "DDTREE_BUDGET": str(DDTREE_BUDGET),
    "DDTREE_TOPK": str(DDTREE_TOPK),
    "DDTREE_LOG_INTERVAL": "4",
    "DDTREE_ALLOW_HYBRID_UNSAFE": "0",
    "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "1",
}
# Tree mode: the budget must fit the drafter's block (<= DRAFT_BLOCK - 1); top-k 8 lets siblings win. Whether a
# tiny drafter's own trees ever accept off their spine depends on the CPU that trained it (an AVX2 build's never
# did in 76 rounds: docs/ci.md, "Tests that hold on any CPU"), so the trees are planned with the drafter's first
# two choices at depth 1 swapped (DDTREE_TEST_DEMOTE_SPINE): whenever its first choice is right, the walk leaves
# the spine, on any build, and the tokens must still be the baseline's.
TREE_BUDGET, TREE_TOPK = DRAFT_BLOCK - 1, 8
TREE_ENV = {
    "DDTREE_VERIFY": "tree",
    "DDTREE_BUDGET": str(TREE_BUDGET),
    "DDTREE_TOPK": str(TREE_TOPK),
    "DDTREE_LOG_INTERVAL": "4",
    "DDTREE_ALLOW_HYBRID_UNSAFE": "0",
    "DDTREE_SELFCHECK_EVERY": "3",  # every third round also re-verified as a chain (ddtree.sglang.selfcheck)
    "DDTREE_TEST_DEMOTE_SPINE": "1",  # off-spine acceptances on any build (ddtree.sglang.bench_hooks.SpineDemotion)
}
SELFCHECK_OK = "the tree verify equals the chain verify"
TREE_PROMPTS = ["tell me a story about a dog", "json for bob, age 31, from paris, with a list of 5 pets"]
# the dense target's prompts (DENSE_TEXTS) by role: chat prompts, tree prompts, the tree batch (tree + a chat one)
DENSE_TEXTS = PROMPTS + TREE_PROMPTS
CHAT, TREE, TREE_BATCH = [0, 1, 2], [3, 4], [3, 4, 0]
# Wide trees: a budget beyond the block verifies in the 2 * block window DFLASH reserves per request.
WIDE_BUDGET = 2 * DRAFT_BLOCK - 1
WIDE_ENV = {**TREE_ENV, "DDTREE_BUDGET": str(WIDE_BUDGET), "DDTREE_TEST_DEMOTE_SPINE": "0"}
# The shape policy, made to switch within one short request: DDTREE_TEST_POLICY=phased feeds it
# synthetic costs (the chain cheap for the first rounds, the trees after) and fast hysteresis; the acceptances,
# the decisions and the rounds run (tree7, tree3, DFLASH's chain) are the real ones.
POLICY_ENV = {
    **TREE_ENV,
    "DDTREE_POLICY": "auto",
    "DDTREE_TEST_POLICY": "phased",
    "DDTREE_SELFCHECK_EVERY": "0",
    "DDTREE_TEST_DEMOTE_SPINE": "0",  # the policy's acceptances as the drafter gives them
}
POLICY_TOKENS = 20  # ~14 rounds of one request: the switches come by about round 8 (CI cost: docs/ci.md)
POLICY_NOTE = re.compile(r"DDTREE policy batch (\S+): (\w+) -> (\w+) \(tok/ms")
METRICS = re.compile(r"DDTREE metrics ((?:\w+=\S+ ?)+)")
# The hybrid target (`tiny_hybrid`: 3 Gated DeltaNet layers + 1 gated attention layer, the Qwen3.6 layout that
# ct200's gpu1 serves with DDTREE shadow): two prompts for baseline and shadow (shadow returns DFLASH's tokens),
# the tree prompts for tree mode.
# (the hybrid target's gap on "json for bob..." is 0.06 at its last token: within FP32_TIE_TOLERANCE.)
HYBRID_TEXTS = PROMPTS[:2] + TREE_PROMPTS
HYBRID_CHAT, HYBRID_TREE = [0, 1], [2, 3]

skip_reason = sglang_skip_reason()
needs_sglang = pytest.mark.skipif(skip_reason is not None, reason=skip_reason or "")


def engine_kwargs(target: Path) -> dict[str, Any]:
    """What opsctl renders for an sglang service (page size 1, no overlap, triton attention), on a CPU."""
    return {
        "model_path": str(target),
        "device": "cpu",
        "dtype": "float32",
        "attention_backend": "triton",
        "triton_attention_num_kv_splits": 1,  # decode attention: 1/8 of the interpreted Triton programs per step
        "page_size": 1,
        "disable_overlap_schedule": True,
        "disable_cuda_graph": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        # SGLang sizes the KV pool from the host's free memory before and after loading the weights; other
        # processes (the tiers beside this one) move it by more than 5%. The pools stay max_total_tokens (KV) and
        # max_running_requests (Gated DeltaNet states) whatever the fraction.
        "mem_fraction_static": 0.5,
        "max_total_tokens": 4096,
        "max_running_requests": 4,
        "skip_server_warmup": True,
        "random_seed": 0,
        "log_level": "info",
    }


def hybrid_overrides(target: Path) -> dict[str, Any]:
    """SGLang's Qwen3.5 config derives the layer types from `full_attention_interval`
    (`sglang/srt/configs/qwen3_next.py:264`), which Qwen3.5/3.6 checkpoints carry and the tiny builder's config
    (transformers' `layer_types` only) does not: pass it, after checking it gives the same layer types."""
    layer_types = json.loads((target / "config.json").read_text())["layer_types"]
    interval = layer_types.index("full_attention") + 1
    derived = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(len(layer_types))]
    assert derived == layer_types, layer_types
    return {"json_model_override_args": json.dumps({"full_attention_interval": interval})}


class Reference(NamedTuple):
    """Transformers' float32 greedy decode per prompt: prompt ids, NEW_TOKENS output ids, and the top-2 logit gap
    at each output position (for the margin-aware comparison of ddtree.greedy_check)."""

    prompts: list[list[int]]
    outputs: list[list[int]]
    gaps: list[list[float]]

    def pick(self, indices: list[int]) -> Reference:
        return Reference(*([column[i] for i in indices] for column in self))


def greedy_reference(models: Path, texts: list[str]) -> Reference:
    """Transformers' float32 greedy continuation of NEW_TOKENS tokens per prompt, with its logit margins."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = models / "target"
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    reference = Reference([], [], [])
    for text in texts:
        messages = [{"role": "user", "content": text}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = list(encoded["input_ids"])
        with torch.no_grad():
            # eos_token_id=None: no stop token. Like SGLang's ignore_eos, EOS may be generated, it ends nothing
            out = model.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=None,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        reference.prompts.append(ids)
        reference.outputs.append(out.sequences[0, len(ids) :].tolist())
        reference.gaps.append(top2_gaps(torch.cat(out.logits)))
    assert all(len(o) == NEW_TOKENS for o in reference.outputs)
    return reference


@pytest.fixture(scope="module")
def dense_reference(tiny_dense: Path) -> Reference:
    """DENSE_TEXTS on the dense target."""
    return greedy_reference(tiny_dense, DENSE_TEXTS)


Launcher = Callable[[str], tuple[dict[str, Any], str]]
# mode -> (engine kwargs beyond engine_kwargs, batches, new tokens, env, per-batch sampling overrides)
ModeSpec = tuple[dict[str, Any], list[list[list[int]]], int, dict[str, str], dict[str, list[dict[str, Any]]]]


def launcher(
    label: str,
    engine: dict[str, Any],
    modes: dict[str, ModeSpec],
    host: EngineHost,
    refusals: dict[str, list[dict[str, Any]]] | None = None,
) -> Launcher:
    """mode -> (result, log) of that mode's Engine run, launched once on first use (the host memoises it).
    `refusals`: per mode, requests sent alone before its batches (driver.py), their errors in result["refusals"]."""

    def get(mode: str) -> tuple[dict[str, Any], str]:
        extra, batches, new_tokens, env, overrides = modes[mode]
        wanted = (refusals or {}).get(mode)
        return host.run(f"{label}{mode}", {**engine, **extra}, batches, new_tokens, env, overrides, refusals=wanted)

    return get


# Before the baseline's batches: a top_k SGLang's scheduler cannot hold (int32) ended the whole server; the DDTREE
# plugin, loaded by every SGLang process whatever the mode, makes it the ValueError of a 400; the largest top_k that
# fits is served. The baseline's batches, decoded after both, are then compared with transformers as ever.
TOP_K_MAX = 2**31 - 1
REFUSALS = [
    {"temperature": 1.0, "top_k": TOP_K_MAX + 1, "max_new_tokens": 2},
    {"temperature": 1.0, "top_k": TOP_K_MAX, "max_new_tokens": 2, "sampling_seed": 3},
]


@pytest.fixture(scope="module")
def engine_runs(tiny_dense: Path, dense_reference: Reference, sglang_engine: EngineHost) -> Launcher:
    """The dense target's Engine runs, one per mode."""
    prompts = dense_reference.prompts
    chat, tree = [prompts[i] for i in CHAT], [prompts[i] for i in TREE]
    tree_batch = [prompts[i] for i in TREE_BATCH]
    draft = {"speculative_draft_model_path": str(tiny_dense / "draft")}
    # tree, third batch: a greedy request beside a sampled one that stops early, so the greedy request's rounds
    # switch from DFLASH's (sampling in the batch) back to tree rounds mid-generation
    mixed = [{}, {"temperature": 1.0, "top_k": 5, "max_new_tokens": 6, "sampling_seed": 7}]
    modes: dict[str, ModeSpec] = {
        # each: all its prompts in one generate call (batched in the scheduler); baseline decodes every prompt
        # the other modes use, so each of them is also compared with it exactly (same engine, same dtype)
        "baseline": ({}, [prompts], BASELINE_TOKENS, {}, {}),
        "dflash": ({"speculative_algorithm": "DFLASH", **draft}, [chat, chat[:1]], NEW_TOKENS, {}, {}),
        # shadow, with --enable-metrics: its decode rounds on /metrics (test_shadow_decode_rounds_are_dflash_rounds)
        "ddtree": (
            {"speculative_algorithm": "DDTREE", **draft, "enable_metrics": True},
            [chat],
            NEW_TOKENS,
            SHADOW_ENV,
            {},
        ),
        # tree: three requests batched, then one alone, then the mixed batch
        "tree": (
            {"speculative_algorithm": "DDTREE", **draft},
            [tree_batch, tree_batch[:1], [tree_batch[1], tree_batch[0]]],
            NEW_TOKENS,
            TREE_ENV,
            {"2": mixed},
        ),
        "wide": ({"speculative_algorithm": "DDTREE", **draft}, [tree], NEW_TOKENS, WIDE_ENV, {}),
        # --enable-metrics on: the ddtree_* series on /metrics, compared with the same run's metrics lines
        "policy": (
            {"speculative_algorithm": "DDTREE", **draft, "enable_metrics": True},
            [tree[:1]],
            POLICY_TOKENS,
            POLICY_ENV,
            {},
        ),
    }
    return launcher("", engine_kwargs(tiny_dense / "target"), modes, sglang_engine, {"baseline": REFUSALS})


@pytest.fixture(scope="module")
def kinds_runs(tiny_dense: Path, dense_reference: Reference, sglang_engine: EngineHost) -> Launcher:
    """Every request kind in one batch, seeded sampling on (--enable-deterministic-inference), every request
    returning its log-probs and top KINDS_TOP_LOGPROBS: "baseline" and "tree"."""
    engine = {**engine_kwargs(tiny_dense / "target"), **KINDS_ENGINE}
    draft = {"speculative_algorithm": "DDTREE", "speculative_draft_model_path": str(tiny_dense / "draft")}
    batches, overrides = [kinds_prompts(dense_reference.prompts)], {"0": kinds(tiny_dense)}

    def get(mode: str) -> tuple[dict[str, Any], str]:
        extra, env = (draft, TREE_ENV) if mode == "tree" else ({}, {})
        return sglang_engine.run(
            f"kinds-{mode}", {**engine, **extra}, batches, KINDS_TOKENS, env, overrides, top_logprobs=KINDS_TOP_LOGPROBS
        )

    return get


# Request kinds (docs/sglang.md, "Request kinds"): one batch holding every kind a tree round serves, decoded by
# the baseline and by tree mode with seeded sampling on; each request's tokens must be the baseline's.
KINDS_ENGINE = {"enable_deterministic_inference": True, "sampling_backend": "pytorch", "max_running_requests": 8}
KINDS_TOKENS = 12  # each decode step of the baseline is one interpreted-Triton forward of the whole batch
KINDS_TOP_LOGPROBS = 3
LOGPROB_TOLERANCE = 1e-4  # float32 on a CPU: the tree verify and the decode step round differently
KIND_NAMES = [
    "greedy, logit_bias bans its 4th greedy token, frequency_penalty 1.5",
    "greedy, presence_penalty 0.8, repetition_penalty 1.3",
    "greedy, EOS pushed up by logit_bias, min_new_tokens 8",
    "seeded, temperature 0.7",
    "seeded, temperature 1.0, top_k 20, top_p 0.9",
    "greedy",
    "greedy, regex (lower-case letters and spaces only)",
]
GRAMMAR_REGEX = "[a-z ]+"
MIN_NEW = 8


# The hybrid target's request kinds: fewer and shorter (each step runs the interpreted GDN kernels)
HYBRID_KINDS_TOKENS = 10
HYBRID_KINDS: list[dict[str, Any]] = [
    {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repetition_penalty": 1.3, "logit_bias": {"10": 5.0}},
    {"temperature": 0.7, "top_p": 0.9, "sampling_seed": 21},
    {"temperature": 1.0, "top_k": 20, "sampling_seed": 22},
]


def hybrid_kinds_prompts(prompts: list[list[int]]) -> list[list[int]]:
    t0, t1 = prompts[HYBRID_TREE[0]], prompts[HYBRID_TREE[1]]
    return [t0, t1, t0]


def kinds_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """The prompt of each request kind (KIND_NAMES): the tree prompts and one chat prompt."""
    t0, t1, c0 = prompts[TREE[0]], prompts[TREE[1]], prompts[CHAT[0]]
    return [t0, t1, c0, t1, t0, c0, c0]


def kinds(models: Path) -> list[dict[str, Any]]:
    """The sampling parameters of each request kind (KIND_NAMES). The banned token is transformers' 4th greedy
    token of the first tree prompt; EOS is the tokenizer's."""
    from transformers import AutoTokenizer

    reference = greedy_reference(models, [DENSE_TEXTS[TREE[0]]])
    eos = AutoTokenizer.from_pretrained(models / "target").eos_token_id
    return [
        {"logit_bias": {str(reference.outputs[0][3]): -100.0}, "frequency_penalty": 1.5},
        {"presence_penalty": 0.8, "repetition_penalty": 1.3},
        {"logit_bias": {str(eos): 30.0}, "min_new_tokens": MIN_NEW},
        {"temperature": 0.7, "sampling_seed": 11},
        {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "sampling_seed": 12},
        {},
        # ignore_eos off: with it on, SGLang's non-speculative decode emits one more token after the grammar
        # completes (it checks completion before advancing the grammar), every speculative round none
        {"regex": GRAMMAR_REGEX, "ignore_eos": False},
    ]


@pytest.fixture(scope="module")
def hybrid_reference(tiny_hybrid: Path) -> Reference:
    """HYBRID_TEXTS on the hybrid target."""
    return greedy_reference(tiny_hybrid, HYBRID_TEXTS)


@pytest.fixture(scope="module")
def hybrid_runs(tiny_hybrid: Path, hybrid_reference: Reference, sglang_engine: EngineHost) -> Launcher:
    """Like engine_runs, on the hybrid target: "baseline" (every prompt), "ddtree" (shadow, the chat prompts in
    one batch) and "tree" (the tree prompts batched, then the first alone)."""
    prompts = hybrid_reference.prompts
    chat, tree = [prompts[i] for i in HYBRID_CHAT], [prompts[i] for i in HYBRID_TREE]
    draft = {"speculative_algorithm": "DDTREE", "speculative_draft_model_path": str(tiny_hybrid / "draft")}
    modes: dict[str, ModeSpec] = {
        "baseline": ({}, [prompts], BASELINE_TOKENS, {}, {}),
        "ddtree": (draft, [chat], NEW_TOKENS, SHADOW_ENV, {}),
        "tree": (draft, [tree, tree[:1]], NEW_TOKENS, TREE_ENV, {}),
        # four request kinds through the recurrent layers, seeded sampling on
        "kinds-baseline": (KINDS_ENGINE, [hybrid_kinds_prompts(prompts)], HYBRID_KINDS_TOKENS, {}, {"0": HYBRID_KINDS}),
        "kinds-tree": (
            {**KINDS_ENGINE, **draft},
            [hybrid_kinds_prompts(prompts)],
            HYBRID_KINDS_TOKENS,
            TREE_ENV,
            {"0": HYBRID_KINDS},
        ),
    }
    target = tiny_hybrid / "target"
    return launcher("hybrid-", {**engine_kwargs(target), **hybrid_overrides(target)}, modes, sglang_engine)


def output_ids(batch: list[dict[str, Any]]) -> list[list[int]]:
    return [out["output_ids"] for out in batch]


def assert_matches_reference(batch: list[dict[str, Any]], reference: Reference, new_tokens: int) -> None:
    """SGLang's engine against transformers (two implementations): every request has `new_tokens` tokens, equal
    to transformers' up to the first difference, which must be a near-tie of transformers' logits
    (ddtree.greedy_check; a real divergence fails with its position, both tokens and the gap)."""
    got = output_ids(batch)
    assert len(got) == len(reference.outputs)
    for i, (tokens, want, gaps) in enumerate(zip(got, reference.outputs, reference.gaps, strict=True)):
        assert len(tokens) == new_tokens, f"request {i}: {len(tokens)} tokens, expected {new_tokens}"
        try:
            checked = compared_length(tokens, want, gaps, FP32_TIE_TOLERANCE)
        except GreedyMismatch as error:
            pytest.fail(f"request {i}: SGLang vs transformers: {error}\nSGLang       {tokens}\ntransformers {want}")
        if checked < new_tokens:
            print(f"request {i}: equal to transformers up to a near-tie at {checked} (gap {gaps[checked]:.4g})")


def assert_equals_baseline(batch: list[dict[str, Any]], baseline: dict[tuple[int, ...], list[int]]) -> None:
    """Within one engine (same kernels, same dtype) a speculative mode must give the baseline's greedy tokens
    exactly, over the baseline's length."""
    for i, (prompt, tokens) in enumerate(zip(batch_prompts(batch), output_ids(batch), strict=True)):
        want = baseline[prompt]
        assert tokens[: len(want)] == want, f"request {i}: SGLang speculative {tokens} != SGLang baseline {want}"


def batch_prompts(batch: list[dict[str, Any]]) -> list[tuple[int, ...]]:
    return [tuple(out["prompt_ids"]) for out in batch]


def baseline_outputs(runs: Launcher) -> dict[tuple[int, ...], list[int]]:
    """Prompt ids -> the SGLang baseline's greedy tokens (BASELINE_TOKENS of them)."""
    (batched,) = runs("baseline")[0]["batches"]
    return dict(zip(batch_prompts(batched), output_ids(batched), strict=True))


def metrics_lines(log: str) -> list[dict[str, str]]:
    return [dict(kv.split("=", 1) for kv in m.group(1).split()) for m in METRICS.finditer(log)]


def accept_lengths(batch: list[dict[str, Any]]) -> list[float]:
    return [float(out["meta_info"]["spec_accept_length"]) for out in batch]


@needs_sglang
def test_baseline_engine_matches_transformers(engine_runs: Launcher, dense_reference: Reference) -> None:
    result, _ = engine_runs("baseline")
    (batched,) = result["batches"]
    assert_matches_reference(batched, dense_reference, BASELINE_TOKENS)


@needs_sglang
def test_a_top_k_beyond_int32_is_refused_and_the_engine_serves_on(engine_runs: Launcher) -> None:
    """SGLang's baseline Engine with the plugin installed (no DDTREE algorithm asked for): top_k 2**31 is a
    ValueError before the scheduler sees it (SGLang's HTTP server answers it with a 400), 2**31 - 1 is served, and
    the batch decoded after both is the baseline's (test_baseline_engine_matches_transformers)."""
    result, _ = engine_runs("baseline")
    refused, served = result["refusals"]
    assert refused.get("error", "").startswith(f"top_k must be -1 (disable) or in [1, {TOP_K_MAX}]"), refused
    assert len(served.get("output_ids", [])) == 2, served
    (batched,) = result["batches"]
    assert all(len(out["output_ids"]) == BASELINE_TOKENS for out in batched)


@needs_sglang
def test_dflash_engine_matches_baseline_and_transformers_and_accepts_blocks(
    engine_runs: Launcher, dense_reference: Reference
) -> None:
    result, _ = engine_runs("dflash")
    batched, single = result["batches"]
    assert_matches_reference(batched, dense_reference.pick(CHAT), NEW_TOKENS)
    assert_matches_reference(single, dense_reference.pick(CHAT[:1]), NEW_TOKENS)
    assert_equals_baseline(batched + single, baseline_outputs(engine_runs))
    assert all(length > 1 for length in accept_lengths(batched + single)), accept_lengths(batched + single)


@needs_sglang
def test_ddtree_shadow_engine_matches_baseline_and_transformers_and_logs_tree_stats(
    engine_runs: Launcher, dense_reference: Reference
) -> None:
    result, log = engine_runs("ddtree")
    (batched,) = result["batches"]
    assert_matches_reference(batched, dense_reference.pick(CHAT), NEW_TOKENS)
    assert_equals_baseline(batched, baseline_outputs(engine_runs))
    assert all(length > 1 for length in accept_lengths(batched)), accept_lengths(batched)

    assert_shadow_log(log, hybrid="none")
    for fields in metrics_lines(log):
        stats = {key: float(value) for key, value in fields.items() if key != "hybrid"}
        assert stats["rounds"] >= 1 and stats["tokens"] >= stats["rounds"]
        assert 1 <= stats["depth"] <= DRAFT_BLOCK - 1  # no deeper than the draft block's rows
        assert stats["width"] >= 1


@needs_sglang
def test_shadow_decode_rounds_are_dflash_rounds(engine_runs: Launcher) -> None:
    """A shadow service serves DFLASH's chain verify and builds its trees only to report them: on /metrics every
    decode round it ran is `kind="dflash", reason="shadow"` (none `tree` or `chain`), while its trees are the
    request-rounds of `ddtree_rounds_total` and the tree histograms, as its DDTREE metrics lines say."""
    from opsctl import promtext

    result, log = engine_runs("ddtree")
    text = result.get("metrics")
    assert text, "no ddtree_* series on /metrics"
    scrape = promtext.parse(text)
    lines = metrics_lines(log)
    assert lines, log[-4000:]

    def total(name: str, **where: str) -> float:
        value = scrape.total(name, where)
        assert value is not None, f"{name} {where} is not on /metrics"
        return value

    rounds = int(lines[-1]["rounds"])
    assert total("ddtree_rounds_total") == rounds and total("ddtree_tree_nodes_count") == rounds
    shadow = total("ddtree_decode_rounds_total", kind="dflash", reason="shadow")
    print(f"shadow: {shadow:.0f} decode rounds (dflash/shadow), {rounds} request-rounds in the lines")
    assert total("ddtree_decode_rounds_total") == shadow  # no tree, chain or other dflash round
    # one batch of len(CHAT) requests: each decode round holds 1..len(CHAT) request-rounds, and the rounds after
    # the last line are on /metrics at once and in a line only when it is written (< log interval of them)
    interval = int(SHADOW_ENV["DDTREE_LOG_INTERVAL"])
    assert rounds / len(CHAT) <= shadow <= rounds + interval - 1, (shadow, rounds)


def assert_logprobs_close(name: str, got: dict[str, Any], want: dict[str, Any]) -> None:
    """SGLang's output_token_logprobs ([logprob, token id, text] per token) and output_top_logprobs (the top K
    per token) of two runs: same tokens, values within LOGPROB_TOLERANCE."""
    for key in ("output_token_logprobs", "output_top_logprobs"):
        g, w = got.get(key), want.get(key)
        assert g and w and len(g) == len(w), f"{name}: {key} {g!r:.200} vs {w!r:.200}"
        for position, (a, b) in enumerate(zip(g, w, strict=True)):
            pairs_a = [a] if key == "output_token_logprobs" else a
            pairs_b = [b] if key == "output_token_logprobs" else b
            assert [p[1] for p in pairs_a] == [p[1] for p in pairs_b], f"{name}: {key}[{position}] tokens differ"
            for x, y in zip(pairs_a, pairs_b, strict=True):
                assert abs(x[0] - y[0]) <= LOGPROB_TOLERANCE, f"{name}: {key}[{position}] {x[0]} vs {y[0]}"


def assert_shadow_log(log: str, hybrid: str) -> None:
    """A shadow run's DDTREE lines: init with the knobs, verify rounds, tree statistics on (no spine mismatch),
    every metrics window a real tree (more than one node, within the budget) and some trees branching."""
    init = f"DDTREE init mode=shadow budget={DDTREE_BUDGET} topk={DDTREE_TOPK} block={DRAFT_BLOCK} hybrid={hybrid}"
    assert init in log and "DDTREE verify completed" in log, log[-4000:]
    assert "statistics disabled" not in log and "spine differs" not in log, log[-4000:]
    lines = metrics_lines(log)
    assert lines, f"no 'DDTREE metrics' line in the log:\n{log[-4000:]}"
    for fields in lines:
        assert 1 < float(fields["nodes"]) <= DDTREE_BUDGET  # a tree, not a chain of one
        assert 1 <= float(fields["tau"]) <= DRAFT_BLOCK
    assert any(float(fields["width"]) > 1 for fields in lines)  # the trees branch somewhere
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))


@needs_sglang
def test_ddtree_tree_engine_matches_baseline_and_transformers_and_accepts_off_the_spine(
    engine_runs: Launcher, dense_reference: Reference
) -> None:
    """DDTREE_VERIFY=tree: one verify forward over the whole tree (SGLang's tree mask, verify_tree_greedy, the
    accepted KV slots committed): greedy tokens must still be the baseline's exactly (and transformers')."""
    result, log = engine_runs("tree")
    batched, single, mixed = result["batches"]
    expected = dense_reference.pick(TREE_BATCH)
    assert_matches_reference(batched, expected, NEW_TOKENS)
    assert_matches_reference(single, expected.pick([0]), NEW_TOKENS)
    # beside a sampled request (DFLASH's rounds while it runs, tree rounds after): still the greedy tokens
    assert_matches_reference(mixed[:1], expected.pick([1]), NEW_TOKENS)
    assert_equals_baseline(batched + single + mixed[:1], baseline_outputs(engine_runs))
    assert len(mixed[1]["output_ids"]) == 6
    assert "take DFLASH's chain verify" not in log  # the sampled request rides the tree rounds too
    assert SELFCHECK_OK in log and "self-check FAILED" not in log
    assert all(length > 1 for length in accept_lengths(batched + single)), accept_lengths(batched + single)
    assert f"DDTREE init mode=tree budget={TREE_BUDGET} topk={TREE_TOPK} block={DRAFT_BLOCK} hybrid=none" in log
    lines = metrics_lines(log)
    assert lines, f"no 'DDTREE metrics' line in the log:\n{log[-4000:]}"
    for fields in lines:
        assert 1 <= float(fields["nodes"]) <= TREE_BUDGET and 1 <= float(fields["tau"]) <= DRAFT_BLOCK
    off_spine = sum(float(fields.get("off_spine", 0)) for fields in lines)
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))
    # A tree that only ever accepted its spine would be a chain verify with extra nodes: show it is not.
    assert off_spine > 0, "no round accepted a non-spine node"


@needs_sglang
def test_every_request_kind_takes_tree_rounds_and_gets_the_baseline_tokens(
    kinds_runs: Launcher, engine_runs: Launcher, tiny_dense: Path
) -> None:
    """logit_bias, each penalty, min_new_tokens, seeded sampling (with and without top-k / top-p) and a regex
    grammar (one vocabulary mask per tree node), batched with greedy rows, every request asking for log-probs:
    tree mode's tokens equal the baseline's token for
    token, their log-probs (and top-3) within LOGPROB_TOLERANCE, and the batch takes tree rounds (no DFLASH
    chain round)."""
    base, _ = kinds_runs("baseline")
    tree, log = kinds_runs("tree")
    (want,) = base["batches"]
    (got,) = tree["batches"]
    params = kinds(tiny_dense)
    banned = int(next(iter(params[0]["logit_bias"])))
    assert banned not in want[0]["output_ids"], "the banned token is in the baseline's output"
    eos = int(next(iter(params[2]["logit_bias"])))
    early, late = want[2]["output_ids"][:MIN_NEW], want[2]["output_ids"][MIN_NEW:]
    assert eos not in early and eos in late, want[2]["output_ids"]
    greedy = baseline_outputs(engine_runs)[tuple(want[1]["prompt_ids"])]
    assert want[1]["output_ids"] != greedy[:KINDS_TOKENS], "the penalties change nothing on this prompt"
    assert want[6]["output_ids"] != want[5]["output_ids"], "the grammar changes nothing on this prompt"
    for name, w, g in zip(KIND_NAMES, want, got, strict=True):
        assert g["output_ids"] == w["output_ids"], f"{name}: tree {g['output_ids']} != baseline {w['output_ids']}"
        assert_logprobs_close(name, g["meta_info"], w["meta_info"])
    assert "take DFLASH's chain verify" not in log, log[-3000:]
    lines = metrics_lines(log)
    assert lines and sum(int(fields["rounds"]) for fields in lines) > 0, log[-3000:]
    assert SELFCHECK_OK in log and "self-check FAILED" not in log
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))


@needs_sglang
def test_hybrid_request_kinds_take_tree_rounds_and_get_the_baseline_tokens(hybrid_runs: Launcher) -> None:
    """Penalties, logit_bias and seeded sampling on the hybrid target: the tree's per-node rules and draws run
    through the GDN tree kernels and still give the baseline's tokens."""
    (want,) = hybrid_runs("kinds-baseline")[0]["batches"]
    tree, log = hybrid_runs("kinds-tree")
    (got,) = tree["batches"]
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g["output_ids"] == w["output_ids"], f"{HYBRID_KINDS[i]}: tree {g['output_ids']} != {w['output_ids']}"
    assert "take DFLASH's chain verify" not in log, log[-3000:]
    assert metrics_lines(log) and SELFCHECK_OK in log and "self-check FAILED" not in log


@needs_sglang
def test_hybrid_baseline_engine_matches_transformers(hybrid_runs: Launcher, hybrid_reference: Reference) -> None:
    """The hybrid target (Gated DeltaNet + attention) on SGLang's engine: prefill (conv1d, chunked delta rule)
    and decode (conv1d update, recurrent delta rule) give transformers' greedy tokens (margin-aware)."""
    result, _ = hybrid_runs("baseline")
    (batched,) = result["batches"]
    assert_matches_reference(batched, hybrid_reference, BASELINE_TOKENS)


@needs_sglang
def test_hybrid_ddtree_shadow_engine_matches_baseline_and_transformers(
    hybrid_runs: Launcher, hybrid_reference: Reference
) -> None:
    """ct200 gpu1's configuration in miniature: DDTREE shadow on a hybrid target. Shadow returns DFLASH's tokens,
    so this also proves DFLASH on a hybrid target (verify through the recurrent layers, the accepted step's
    SSM state and conv window committed): the baseline's greedy tokens, blocks accepted, the plugin reporting
    the target as hybrid (`hybrid=exact`: shadow verifies the spine, a chain SGLang handles exactly)."""
    result, log = hybrid_runs("ddtree")
    (batched,) = result["batches"]
    assert_matches_reference(batched, hybrid_reference.pick(HYBRID_CHAT), NEW_TOKENS)
    assert_equals_baseline(batched, baseline_outputs(hybrid_runs))
    assert all(length > 1 for length in accept_lengths(batched)), accept_lengths(batched)
    assert_shadow_log(log, hybrid="exact")


@needs_sglang
def test_hybrid_ddtree_tree_engine_is_exact_through_the_recurrent_layers(
    hybrid_runs: Launcher, hybrid_reference: Reference
) -> None:
    """DDTREE_VERIFY=tree on the hybrid target: one verify forward over the whole tree, SGLang's GDN tree kernels
    (each node's conv window from its ancestors, its recurrent state from its parent), the last accepted node's
    state committed. A flat-order verify would feed siblings each other's states; the greedy tokens must still be
    the baseline's exactly (and transformers'), with rounds accepting off the spine."""
    result, log = hybrid_runs("tree")
    batched, single = result["batches"]
    expected = hybrid_reference.pick(HYBRID_TREE)
    assert_matches_reference(batched, expected, NEW_TOKENS)
    assert_matches_reference(single, expected.pick([0]), NEW_TOKENS)
    assert_equals_baseline(batched + single, baseline_outputs(hybrid_runs))
    assert all(length > 1 for length in accept_lengths(batched + single)), accept_lengths(batched + single)
    assert f"DDTREE init mode=tree budget={TREE_BUDGET} topk={TREE_TOPK} block={DRAFT_BLOCK} hybrid=exact" in log
    assert SELFCHECK_OK in log and "self-check FAILED" not in log
    lines = metrics_lines(log)
    assert lines, f"no 'DDTREE metrics' line in the log:\n{log[-4000:]}"
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))
    assert all(fields.get("hybrid") != "unsafe" for fields in lines)
    assert sum(float(fields.get("off_spine", 0)) for fields in lines) > 0, "no round accepted a non-spine node"


@needs_sglang
def test_ddtree_wide_tree_engine_matches_baseline_and_transformers(
    engine_runs: Launcher, dense_reference: Reference
) -> None:
    """DDTREE_BUDGET = 2 * block - 1: trees of more nodes than the draft block, verified in the 2 * block KV
    window DFLASH reserves per request (the accepted path still fits one block): still the baseline's tokens."""
    result, log = engine_runs("wide")
    (batched,) = result["batches"]
    assert_matches_reference(batched, dense_reference.pick(TREE), NEW_TOKENS)
    assert_equals_baseline(batched, baseline_outputs(engine_runs))
    assert f"DDTREE init mode=tree budget={WIDE_BUDGET} topk={TREE_TOPK} block={DRAFT_BLOCK} hybrid=none" in log
    lines = metrics_lines(log)
    assert lines, f"no 'DDTREE metrics' line in the log:\n{log[-4000:]}"
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))
    assert any(float(fields["nodes"]) > DRAFT_BLOCK for fields in lines)  # wider than the draft block
    assert all(1 <= float(fields["tau"]) <= DRAFT_BLOCK for fields in lines)


@needs_sglang
def test_ddtree_tree_policy_switches_shape_mid_request_and_keeps_the_baseline_tokens(
    engine_runs: Launcher, dense_reference: Reference
) -> None:
    """DDTREE_POLICY=auto in the SGLang tree worker: within one request the policy moves from the configured
    tree to DFLASH's chain round and back to a tree (forced by DDTREE_TEST_POLICY's costs; one request: the
    cheapest run whose rounds all belong to it); the greedy tokens stay the baseline's exactly (and
    transformers'), and the metrics lines carry the choice. test_sglang_policy_glue covers batches and TP."""
    result, log = engine_runs("policy")
    (batched,) = result["batches"]
    assert_matches_reference(batched, dense_reference.pick(TREE[:1]), POLICY_TOKENS)
    assert_equals_baseline(batched, baseline_outputs(engine_runs))
    assert "has no effect" not in log and "does not run the shape policy" not in log
    notes = POLICY_NOTE.findall(log)
    print("\n".join(m.group(0) for m in re.finditer(r"DDTREE policy .*", log)))
    to_chain = [i for i, (_, old, new) in enumerate(notes) if old.startswith("tree") and new == "chain"]
    back = [i for i, (_, old, new) in enumerate(notes) if old == "chain" and new.startswith("tree")]
    assert to_chain and back and to_chain[0] < back[-1], notes
    assert all(span == "1" for span, _, _ in notes), notes  # the one request's rounds
    lines = metrics_lines(log)
    assert lines and all(fields["policy"] == "auto" for fields in lines), log[-4000:]
    assert list(lines[-1])[-7:] == ["policy", "shape", "choice", "est", "switches", "probes", "gap"]
    assert int(lines[-1]["switches"]) >= 2 and int(lines[-1]["probes"]) >= 1
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))


# --- tensor parallelism: TP 2 on SGLang's CPU engine (gloo between the two scheduler processes) -----------------
# SGLang's CPU engine binds each rank's threads to cores, by default one NUMA node per rank; one core each here.
TP2_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": f"0|{min(1, (os.cpu_count() or 1) - 1)}"}


@pytest.fixture(scope="module")
def tp2_runs(tiny_dense: Path, dense_reference: Reference, sglang_engine: EngineHost) -> Launcher:
    """The dense target at --tp-size 2: its LM head vocab-parallel (each rank half the rows), so DDTREE builds its
    trees from each rank's top-k, gathered (ddtree.sglang.vocab_parallel). The tree prompts: baseline, DDTREE tree
    (batched, then the first alone) and DDTREE shadow."""
    tree = [dense_reference.prompts[i] for i in TREE]
    draft = {"speculative_algorithm": "DDTREE", "speculative_draft_model_path": str(tiny_dense / "draft")}
    modes: dict[str, ModeSpec] = {
        "baseline": ({}, [tree], BASELINE_TOKENS, TP2_ENV, {}),
        "tree": (draft, [tree, tree[:1]], NEW_TOKENS, {**TREE_ENV, **TP2_ENV}, {}),
        "ddtree": (draft, [tree], NEW_TOKENS, {**SHADOW_ENV, **TP2_ENV}, {}),
    }
    return launcher("tp2-", {**engine_kwargs(tiny_dense / "target"), "tp_size": 2}, modes, sglang_engine)


@needs_sglang
def test_tp2_ddtree_tree_engine_equals_the_tp2_baseline_token_for_token(
    tp2_runs: Launcher, dense_reference: Reference
) -> None:
    """DDTREE_VERIFY=tree at TP 2: both ranks must build the same trees (a rank verifying other tokens would give
    wrong logits through the all-reduces), so the greedy tokens are the TP-2 baseline's exactly, and
    transformers'; only rank 0 writes the DDTREE lines."""
    (base,) = tp2_runs("baseline")[0]["batches"]
    expected = dense_reference.pick(TREE)
    assert_matches_reference(base, expected, BASELINE_TOKENS)
    result, log = tp2_runs("tree")
    batched, single = result["batches"]
    assert_matches_reference(batched, expected, NEW_TOKENS)
    assert_matches_reference(single, expected.pick([0]), NEW_TOKENS)
    assert_equals_baseline(batched + single, dict(zip(batch_prompts(base), output_ids(base), strict=True)))
    assert all(length > 1 for length in accept_lengths(batched + single)), accept_lengths(batched + single)
    init = f"DDTREE init mode=tree budget={TREE_BUDGET} topk={TREE_TOPK} block={DRAFT_BLOCK} hybrid=none"
    assert log.count(init) == 1, log[-4000:]  # rank 0 only
    assert "TP0] DDTREE init" in log and "TP1] DDTREE" not in log
    assert SELFCHECK_OK in log and "self-check FAILED" not in log
    lines = metrics_lines(log)
    assert lines and all(1 <= float(f["nodes"]) <= TREE_BUDGET for f in lines), log[-4000:]
    print("\n".join(m.group(0) for m in METRICS.finditer(log)))


@needs_sglang
def test_tp2_ddtree_shadow_keeps_its_statistics_on(tp2_runs: Launcher, dense_reference: Reference) -> None:
    """Shadow at TP 2: DFLASH's tokens (the baseline's), and tree statistics from the vocab-parallel head instead
    of 'statistics disabled'."""
    (base,) = tp2_runs("baseline")[0]["batches"]
    result, log = tp2_runs("ddtree")
    (batched,) = result["batches"]
    assert_matches_reference(batched, dense_reference.pick(TREE), NEW_TOKENS)
    assert_equals_baseline(batched, dict(zip(batch_prompts(base), output_ids(base), strict=True)))
    assert_shadow_log(log, hybrid="none")
    assert "TP1] DDTREE" not in log


def window_sum(lines: list[dict[str, str]], key: str) -> tuple[float, float]:
    """Σ over the metrics lines of `key`'s window mean times the window's rounds (the line's rounds minus the
    previous line's), and the error bound of that sum from the lines' 3 decimals."""
    total, bound, before = 0.0, 0.0, 0
    for fields in lines:
        rounds = int(fields["rounds"])
        total += float(fields[key]) * (rounds - before)
        bound += 0.0005 * (rounds - before)
        before = rounds
    return total, bound + 1e-9


@needs_sglang
def test_ddtree_series_on_metrics_equal_the_metrics_lines_of_the_same_rounds(engine_runs: Launcher) -> None:
    """--enable-metrics on a tree service (the policy run: tree and chain rounds, the policy's shape and
    switches): what SGLang's /metrics serves of the `ddtree_*` series after the request equals what the run's
    `DDTREE metrics` lines say over the same rounds. Parsed by opsctl's Prometheus text parser (opsctl status)."""
    from opsctl import promtext

    result, log = engine_runs("policy")
    lines = metrics_lines(log)
    assert lines, log[-4000:]
    text = result.get("metrics")
    assert text, "no ddtree_* series on /metrics"
    print(text)
    scrape = promtext.parse(text)
    assert scrape.skipped == 0
    (model,) = {labels["model_name"] for labels, _ in scrape.samples["ddtree_rounds_total"]}
    assert model, "no model_name label"
    last = lines[-1]
    rounds, tokens = int(last["rounds"]), int(last["tokens"])

    def total(name: str, **where: str) -> float:
        value = scrape.total(name, where)
        assert value is not None, f"{name} {where} is not on /metrics"
        return value

    assert total("ddtree_rounds_total") == rounds and total("ddtree_committed_tokens_total") == tokens
    assert total("ddtree_accept_length_count") == rounds and total("ddtree_accept_length_sum") == tokens
    for series, key in (("nodes", "nodes"), ("depth", "depth"), ("width", "width")):
        want, bound = window_sum(lines, key)
        assert total(f"ddtree_tree_{series}_count") == rounds, series
        assert abs(total(f"ddtree_tree_{series}_sum") - want) <= bound, (series, want)
    want, bound = window_sum(lines, "off_spine")
    assert abs(total("ddtree_off_spine_rounds_total") - want) <= bound
    for phase in ("draft", "build", "verify", "commit"):
        want, bound = window_sum(lines, f"{phase}_ms")
        got = scrape.total("ddtree_phase_seconds_total", {"phase": phase}) or 0.0
        assert abs(got * 1000.0 - want) <= bound + 1e-6 * want, (phase, got, want)
    # the policy: switches and probes, and each bucket's shape (tree nodes, 0 for the chain) as `choice` says
    assert total("ddtree_policy_switches_total") == int(last["switches"]) >= 2
    assert total("ddtree_policy_probes_total") == int(last["probes"])
    for part in last["choice"].split(","):
        bucket, _, shape = part.partition(":")
        budget = 0 if shape == "chain" else int(shape.removeprefix("tree"))
        assert total("ddtree_policy_shape_budget", bucket=bucket) == budget, part
    # decode rounds: one request, so one per request-round; the rounds after the last line are counted on
    # /metrics at once and in a line only when it is written (at most log interval - 1 of them)
    tree, chain = total("ddtree_decode_rounds_total", kind="tree"), total("ddtree_decode_rounds_total", kind="chain")
    interval = int(POLICY_ENV["DDTREE_LOG_INTERVAL"])
    assert tree > 0 and chain > 0 and rounds <= tree + chain <= rounds + interval - 1, (tree, chain, rounds)
    assert total("ddtree_decode_rounds_total", kind="dflash") == 0 and total("ddtree_selfcheck_failed") == 0
