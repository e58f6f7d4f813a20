"""Smoke test and equivalence check of a service over its OpenAI-compatible API.

Judging is pure (`judge_chat`, `compare_tokens`, `summarize_equivalence`), so every pass/fail rule is unit
tested on recorded responses; the request functions only fetch. Smoke requests disable thinking
(`chat_template_kwargs: {"enable_thinking": false}`) and accept text in either `content` or
`reasoning_content` (Qwen3.6 answers in a thinking block by default).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from opsctl.chat import PROMPT_KEYS, chat_body, first_model, load_prompt_items
from opsctl.errors import SmokeError
from opsctl.inventory.model import SMOKE_PROMPT as DEFAULT_SMOKE_PROMPT

SMOKE_PROMPT = DEFAULT_SMOKE_PROMPT
SMOKE_MAX_TOKENS = 32
GOOD_FINISH = ("stop", "length")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...]  # why it failed (empty when ok)
    text: str  # content, or reasoning_content when content is empty
    finish_reason: str | None
    completion_tokens: int | None


def judge_chat(status_code: int, body: Any) -> Verdict:
    """Pass only if HTTP 200, finish_reason stop|length, completion_tokens > 0, content or reasoning non-empty."""
    reasons: list[str] = []
    if status_code != 200:
        detail = ""
        if isinstance(body, Mapping):
            err = body.get("error", body.get("message", body.get("detail")))
            detail = f": {err.get('message', err) if isinstance(err, Mapping) else err}" if err else ""
        return Verdict(False, (f"HTTP {status_code}{detail}",), "", None, None)
    if not isinstance(body, Mapping):
        return Verdict(False, ("response is not a JSON object",), "", None, None)
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else None
    if choice is None:
        reasons.append("no choices in the response")
    message = choice.get("message") if choice else None
    message = message if isinstance(message, Mapping) else {}
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or ""
    text = (
        content if isinstance(content, str) and content.strip() else (reasoning if isinstance(reasoning, str) else "")
    )
    finish = choice.get("finish_reason") if choice else None
    if choice is not None and finish not in GOOD_FINISH:
        reasons.append(f"finish_reason is {finish!r}, expected stop or length")
    usage = body.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        reasons.append("usage.completion_tokens missing")
        tokens = None
    elif tokens <= 0:
        reasons.append(f"completion_tokens is {tokens}")
    if choice is not None and not text.strip():
        reasons.append("content and reasoning_content are both empty")
    return Verdict(not reasons, tuple(reasons), text, finish if isinstance(finish, str) else None, tokens)


@dataclass(frozen=True)
class SmokeResult:
    host: str
    service: str
    model: str | None
    ok: bool
    reasons: tuple[str, ...]
    text: str
    finish_reason: str | None
    completion_tokens: int | None
    latency_s: float


def smoke_service(
    client: httpx.Client,
    host: str,
    service: str,
    base: str,
    headers: Mapping[str, str],
    prompt: str = SMOKE_PROMPT,
    max_tokens: int = SMOKE_MAX_TOKENS,
    timeout: float = 120.0,
) -> SmokeResult:
    """/v1/models then one chat completion at temperature 0, judged by `judge_chat`."""
    start = time.monotonic()
    try:
        model = first_model(client, base, headers, timeout)
    except SmokeError as exc:
        return SmokeResult(host, service, None, False, (exc.message,), "", None, None, time.monotonic() - start)
    try:
        response = client.post(
            f"{base}/v1/chat/completions", json=chat_body(model, prompt, max_tokens), headers=dict(headers),
            timeout=timeout,
        )  # fmt: skip
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        verdict = judge_chat(response.status_code, body)
    except httpx.HTTPError as exc:
        verdict = Verdict(False, (f"{type(exc).__name__}: {exc}",), "", None, None)
    return SmokeResult(
        host, service, model, verdict.ok, verdict.reasons, verdict.text, verdict.finish_reason,
        verdict.completion_tokens, time.monotonic() - start,
    )  # fmt: skip


# ---------------------------------------------------------------- equivalence


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    max_tokens: int = 64
    sampling: tuple[tuple[str, float], ...] = ()  # SGLang sampling params beside temperature 0 (docs/deploy.md)

    @property
    def seeded(self) -> bool:
        """A sampled prompt (temperature > 0): comparable only where both servers draw with seeds."""
        return dict(self.sampling).get("temperature", 0.0) > 0.0

    @property
    def plain(self) -> bool:
        """Greedy with no rule that changes the greedy choice (penalties, min_new_tokens at their "off" values);
        top_k, top_p, min_p and the seed change nothing when greedy."""
        values = dict(self.sampling)
        return not self.seeded and all(values.get(k, off) == off for k, off in RULES_OFF.items())


# The request rules that change a greedy choice, at their "off" values: a prompt that sets one is not plain.
RULES_OFF: dict[str, float] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}


# The sampling params an equivalence prompt may set, with their ranges (SGLang's own checks).
SAMPLING_KEYS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (1e-6, 1.0),
    "top_k": (-1, 1 << 20),
    "min_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "repetition_penalty": (1e-6, 2.0),
    "min_new_tokens": (0, 4096),
    "sampling_seed": (0, 2**63 - 1),
}
# SGLang 0.5.23's SamplingParams refuses a float where these are counts or a seed (`sampling_seed: 1.5` is a 400
# there, so the prompt would fail on the service and pass on the reference engine).
INTEGER_SAMPLING_KEYS = frozenset({"top_k", "min_new_tokens", "sampling_seed"})


def _sampling_value(where: str, i: int, key: str, value: Any) -> float:
    """One `sampling:` value, checked against SGLang's rule for its key."""
    lo, hi = SAMPLING_KEYS[key]
    if key in INTEGER_SAMPLING_KEYS:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise SmokeError(f"{where}: prompts[{i}].sampling.{key} must be an integer in [{lo}, {hi}]", "fix the file")
    elif isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise SmokeError(f"{where}: prompts[{i}].sampling.{key} must be a number in [{lo}, {hi}]", "fix the file")
    if key == "top_k" and value == 0:
        # SGLang: "top_k must be -1 (disable), or at least 1"
        raise SmokeError(f"{where}: prompts[{i}].sampling.top_k is 0", "use -1 (no top-k) or at least 1")
    return float(value) if key not in INTEGER_SAMPLING_KEYS else int(value)


def _sampling(where: str, i: int, raw: Any, max_tokens: int) -> tuple[tuple[str, float], ...]:
    """A prompt's `sampling:` mapping, validated key by key; a sampled one must carry its seed."""
    if not isinstance(raw, dict):
        raise SmokeError(f"{where}: prompts[{i}].sampling must be a mapping", "fix the file, or drop `sampling:`")
    out: list[tuple[str, float]] = []
    for key, value in raw.items():
        if key not in SAMPLING_KEYS:
            allowed = ", ".join(SAMPLING_KEYS)
            raise SmokeError(f"{where}: prompts[{i}].sampling: unknown key {str(key)[:30]!r}", f"use {allowed}")
        out.append((key, _sampling_value(where, i, key, value)))
    values = dict(out)
    if values.get("min_new_tokens", 0) > max_tokens:
        # SGLang: "min_new_tokens must be in [0, max_new_tokens]"
        raise SmokeError(
            f"{where}: prompts[{i}].sampling.min_new_tokens {values['min_new_tokens']} > max_tokens {max_tokens}",
            "lower min_new_tokens or raise max_tokens",
        )
    if values.get("temperature", 0.0) > 0.0 and "sampling_seed" not in values:
        raise SmokeError(f"{where}: prompts[{i}] samples without a sampling_seed", "add sampling.sampling_seed")
    if values.get("min_p", 0.0) > 0.0 and "sampling_seed" in values:
        # SGLang 0.5.23's seeded sampler asserts against min_p, and the assertion ends its scheduler: the smoke
        # test would take the service down (docs/sglang.md, "Request kinds")
        raise SmokeError(
            f"{where}: prompts[{i}] sets min_p beside a sampling_seed, which stops SGLang's scheduler",
            "drop sampling.min_p from seeded prompts",
        )
    return tuple(out)


EQUIVALENCE_KEYS = PROMPT_KEYS | {"sampling"}


def load_prompts(path: Path | None = None) -> list[Prompt]:
    """The user's YAML prompt file, or the shipped default set (opsctl/data/prompts/equivalence.yaml).

    Format: `prompts: [{id: name, prompt: text, max_tokens: 64, sampling: {...}}, ...]` (max_tokens and
    sampling optional; a sampled prompt names its `sampling_seed`).
    """
    where, items = load_prompt_items(path, "equivalence.yaml", EQUIVALENCE_KEYS)
    prompts: list[Prompt] = []
    for i, (pid, item) in enumerate(items):
        max_tokens = item.get("max_tokens", 64)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 4096:
            raise SmokeError(f"{where}: prompts[{i}].max_tokens must be an integer 1..4096", "fix the file")
        sampling = _sampling(where, i, item["sampling"], max_tokens) if "sampling" in item else ()
        prompts.append(Prompt(pid, item["prompt"], max_tokens, sampling))
    return prompts


@dataclass(frozen=True)
class Generation:
    ids: tuple[int, ...] | None  # output token ids (None when the server returned only text)
    text: str
    via: str  # "generate+chat-template" | "generate+text"


@dataclass(frozen=True)
class PromptAgreement:
    id: str
    equal: bool
    first_divergence: int | None  # index of the first differing token (or char, text mode); None when equal
    length_service: int
    length_baseline: int
    unit: str  # "tokens" | "chars"


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """First index where the sequences differ (a prefix differs at the shorter length); None if identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(prompt_id: str, service: Generation, baseline: Generation) -> PromptAgreement:
    if service.ids is not None and baseline.ids is not None:
        at = first_divergence(service.ids, baseline.ids)
        return PromptAgreement(prompt_id, at is None, at, len(service.ids), len(baseline.ids), "tokens")
    at = first_divergence(service.text, baseline.text)
    return PromptAgreement(prompt_id, at is None, at, len(service.text), len(baseline.text), "chars")


@dataclass(frozen=True)
class EquivalenceReport:
    service: str
    baseline: str
    threshold: float  # required fraction of prompts in full agreement
    prompts: tuple[PromptAgreement, ...] = field(default=())
    agreement: float = 0.0  # fraction of prompts whose outputs are identical
    token_agreement: float = 0.0  # fraction of positions equal up to each pair's shorter length
    passed: bool = False
    error: str | None = None  # the service (or the baseline) failed to answer; the others still ran
    left_out: tuple[LeftOut, ...] = ()  # prompts this service's mode does not promise to match (`comparable`)


def summarize_equivalence(
    service: str, baseline: str, results: Sequence[PromptAgreement], threshold: float = 1.0
) -> EquivalenceReport:
    if not results:
        return EquivalenceReport(service, baseline, threshold, (), 0.0, 0.0, False)
    agree = sum(1 for r in results if r.equal) / len(results)
    compared = sum(max(r.length_service, r.length_baseline) for r in results)
    matched = sum(
        max(r.length_service, r.length_baseline) if r.first_divergence is None else r.first_divergence for r in results
    )
    tok = matched / compared if compared else 1.0
    return EquivalenceReport(service, baseline, threshold, tuple(results), agree, tok, agree >= threshold - 1e-12)


def _post(client: httpx.Client, url: str, body: dict[str, Any], headers: Mapping[str, str], timeout: float) -> Any:
    try:
        response = client.post(url, json=body, headers=dict(headers), timeout=timeout)
    except httpx.HTTPError as exc:
        raise SmokeError(f"{url}: {type(exc).__name__}: {exc}", "is the service running?") from None
    if response.status_code != 200:
        raise SmokeError(f"{url}: HTTP {response.status_code}: {response.text[:200]}", "check the service's logs")
    try:
        return response.json()
    except ValueError:
        raise SmokeError(f"{url}: response is not JSON", "check the service") from None


def chatml(user: str) -> str:
    """The prompt as a Qwen chat turn with thinking off (ChatML, the template of every Qwen3/3.5/3.6 model),
    used when the server cannot apply its own template (/tokenize). The special tokens are parsed by the
    server's tokenizer. Both servers get the same text, so the comparison stays exact either way."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def chat_input_ids(
    client: httpx.Client, base: str, model: str, prompt: str, headers: Mapping[str, str], timeout: float
) -> list[int] | None:
    """The chat-templated prompt's token ids from the server's /tokenize (thinking off), or None if the
    server has no such endpoint (then equivalence compares plain-text /generate outputs)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    for path in ("/tokenize", "/v1/tokenize"):
        try:
            response = client.post(f"{base}{path}", json=body, headers=dict(headers), timeout=timeout)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            continue
        try:
            tokens = response.json().get("tokens")
        except (ValueError, AttributeError):
            continue
        if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens):
            return tokens
    return None


def generate_sampling(prompt: Prompt) -> dict[str, Any]:
    """The `sampling_params` /generate gets for a prompt: greedy unless the prompt's `sampling:` says otherwise."""
    return {"temperature": 0, "max_new_tokens": prompt.max_tokens, **dict(prompt.sampling)}


def generate(
    client: httpx.Client,
    base: str,
    prompt: Prompt,
    headers: Mapping[str, str],
    input_ids: list[int] | None,
    timeout: float = 300.0,
) -> Generation:
    """Generation through SGLang's native /generate (token ids out): greedy unless the prompt says otherwise."""
    body: dict[str, Any] = {"sampling_params": generate_sampling(prompt)}
    if input_ids is not None:
        body["input_ids"] = input_ids
    else:
        body["text"] = chatml(prompt.text)
    data = _post(client, f"{base}/generate", body, headers, timeout)
    if isinstance(data, list):  # SGLang answers a batch shape for some inputs
        data = data[0] if data else {}
    if not isinstance(data, Mapping):
        raise SmokeError(f"{base}/generate: unexpected response shape", "check the server version")
    ids = data.get("output_ids")
    out_ids = tuple(ids) if isinstance(ids, list) and all(isinstance(t, int) for t in ids) else None
    via = "generate+chat-template" if input_ids is not None else "generate+chatml"
    return Generation(out_ids, str(data.get("text", "")), via)


@dataclass(frozen=True)
class LeftOut:
    ids: tuple[str, ...]  # the prompts left out
    why: str


@dataclass(frozen=True)
class Comparable:
    """What one service's equivalence run compares, and what it leaves out and why (`comparable`)."""

    prompts: tuple[Prompt, ...]
    left_out: tuple[LeftOut, ...]


UNSEEDED_WHY = (
    "seeded sampled prompts: SGLang draws seeded samples only with --enable-deterministic-inference on both "
    "services (docs/sglang.md, 'Request kinds')"
)
DFLASH_WHY = (
    "sampled, penalized and min_new_tokens prompts: SGLang's DFLASH ({mode}) promises the baseline's greedy "
    "tokens only; it does not reproduce seeded draws, relaxes penalties and can end before min_new_tokens "
    "(docs/sglang.md, 'Request kinds')"
)


def comparable(prompts: Sequence[Prompt], engine: str, mode: str, seeded: bool) -> Comparable:
    """The prompts a service of this engine and mode promises to answer as the baseline does. SGLang's `linear` and
    `shadow` are DFLASH, which keeps greedy plain outputs only; SGLang's `tree` and every reference engine mode keep
    every kind. Seeded sampled prompts need both servers to draw by seed (`seeded`, `seeded_sampling`)."""
    dflash = engine == "sglang" and mode in ("linear", "shadow")
    kept: list[Prompt] = []
    dropped: dict[str, list[str]] = {}
    for p in prompts:
        if dflash and not p.plain:
            dropped.setdefault(DFLASH_WHY.format(mode=mode), []).append(p.id)
        elif p.seeded and not seeded:
            dropped.setdefault(UNSEEDED_WHY, []).append(p.id)
        else:
            kept.append(p)
    return Comparable(tuple(kept), tuple(LeftOut(tuple(ids), why) for why, ids in dropped.items()))


def run_equivalence(
    client: httpx.Client,
    service: tuple[str, str, Mapping[str, str]],  # (name, base url, headers)
    baseline: tuple[str, str, Mapping[str, str]],
    prompts: Sequence[Prompt],
    threshold: float = 1.0,
    baseline_cache: dict[str, Generation] | None = None,
    progress: Any = None,
    seeded: bool = False,
) -> EquivalenceReport:
    """Outputs of `service` vs `baseline` per prompt. Input ids come from the baseline's /tokenize (chat
    template, thinking off) when it has one, and both servers get the very same ids. Seeded sampled prompts
    only when `seeded` (both servers draw with seeds: `seeded_sampling`); the others are left out."""
    name, base, headers = service
    b_name, b_base, b_headers = baseline
    cache = baseline_cache if baseline_cache is not None else {}
    model = first_model(client, b_base, b_headers, 30.0)
    results: list[PromptAgreement] = []
    for prompt in prompts:
        if prompt.seeded and not seeded:
            continue
        ids = chat_input_ids(client, b_base, model, prompt.text, b_headers, 30.0)
        if prompt.id not in cache:
            cache[prompt.id] = generate(client, b_base, prompt, b_headers, ids)
        mine = generate(client, base, prompt, headers, ids)
        agreement = compare(prompt.id, mine, cache[prompt.id])
        results.append(agreement)
        if progress is not None:
            progress(agreement)
    return summarize_equivalence(name, b_name, results, threshold)


DETERMINISTIC_FLAG = "--enable-deterministic-inference"


def seeded_sampling(engine: str, extra_args: Sequence[str]) -> bool:
    """Whether a service draws seeded samples by (seed, position), so that seeded sampled outputs can be compared
    token for token: the reference engine always; SGLang only with --enable-deterministic-inference (it fills
    `sampling_seed` only then; docs/sglang.md, "Request kinds")."""
    return engine == "reference" or DETERMINISTIC_FLAG in extra_args
