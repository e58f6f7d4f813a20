"""Request bodies validated once at the boundary into frozen dataclasses; bad input raises ``RequestError``.

Pure functions over already-parsed JSON; the app turns ``RequestError`` into a 400 with SGLang's error shape for
the endpoint. The sampling rules are SGLang 0.5.23's, in its order: the request model's types (pydantic for the
OpenAI endpoints; for /generate the JSON contract, `sglang.api.v1.api_types.decode_SamplingParams`), then
`SamplingParams.__post_init__` (greedy forces top_k 1), `normalize` (at most 32 stop strings) and `verify`
(ranges, min_new_tokens <= max_new_tokens), plus the DDTREE plugin's top_k bound (`ddtree.sglang.sampling_guard`).
tests/runtime/test_sglang_sampling_rules.py checks them against SGLang's own code.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddtree.sglang.sampling_guard import top_k_refusal


class RequestError(ValueError):
    """A client error: 400 with ``message``; ``param`` names the offending field when there is one. ``shape`` is
    SGLang's body for it: "openai" (`{"object": "error", "message", ...}`), "native" (/generate's refusals after
    its contract check: `{"error": {"message": ...}}`) or "contract" (/generate's JSON contract: `{"error": "..."}`)."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, shape: str = "openai", stream: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.shape = shape
        self.stream = stream  # a native refusal of a streamed /generate: SGLang answers 200 and one SSE error event

    def native(self, stream: bool = False) -> RequestError:
        """The same refusal in /generate's native shape (a contract refusal keeps its own)."""
        if self.shape == "contract":
            return self
        return RequestError(self.message, self.param, self.status, "native", stream)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None  # None = up to the context length (chat) / endpoint default applied later
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    no_stop_trim: bool = False  # keep the matched stop string in the text (SGLang's sampling param)
    # what SGLang's sampler and penalizers apply (ddtree.acceptance): off at these defaults
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: tuple[ChatMessage, ...]
    sampling: Sampling
    stream: bool
    include_usage: bool
    chat_template_kwargs: Mapping[str, Any]
    separate_reasoning: bool
    continue_final_message: bool = False
    lora_path: Any = None  # as sent; lora_refused() judges it


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | tuple[int, ...]
    sampling: Sampling
    stream: bool
    include_usage: bool
    lora_path: Any = None


@dataclass(frozen=True)
class GenerateRequest:
    text: str | None
    input_ids: tuple[int, ...] | None
    sampling: Sampling
    stream: bool
    lora_path: Any = None


@dataclass(frozen=True)
class TokenizeRequest:
    model: str | None
    prompt: str | None  # plain text, or
    messages: tuple[ChatMessage, ...] | None  # chat messages through the chat template
    add_special_tokens: bool
    chat_template_kwargs: Mapping[str, Any]


COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
SEED_RANGE = (-(2**63), 2**63 - 1)  # SGLang's sampling_seed range (SamplingParams.verify)
MAX_STOP_COUNT = 32  # SGLang's SamplingParams.normalize
GREEDY_BELOW = 1e-6  # SGLang's _SAMPLING_EPS: a temperature in [0, this) is greedy, and top_k becomes 1
# Fields whose null SGLang's pydantic request models refuse (declared without Optional), per endpoint.
_CHAT_NOT_NULL = ("frequency_penalty", "presence_penalty", "min_tokens", "ignore_eos", "no_stop_trim")
_COMPLETION_NOT_NULL = (*_CHAT_NOT_NULL, "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# /generate's sampling_params keys (sglang.api.v1.api_types._FIELDS_SamplingParams): any other is a contract 400
GENERATE_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip
_GENERATE_INTS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval", "sampling_seed", "beam_width")
_GENERATE_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_GENERATE_BOOLS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")

# Fields SGLang implements and this engine does not, with the values that mean "off" (None always does). A field
# present with any other value is a 400 naming it: a request is never answered as if the field were not there.
_SAMPLING_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "regex": (),
    "ebnf": (),
    "json_schema": (),
    "stop_regex": (),
    "response_format": ({"type": "text"},),
}
CHAT_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    **_SAMPLING_UNSUPPORTED,
    "logprobs": (False,),
    "top_logprobs": (0,),
    "return_hidden_states": (False,),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
}
COMPLETION_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    **_SAMPLING_UNSUPPORTED,
    "logprobs": (),
    "suffix": ("",),
    "best_of": (1,),
    "return_hidden_states": (False,),
}
GENERATE_UNSUPPORTED: dict[str, tuple[Any, ...]] = {  # inside sampling_params
    **_SAMPLING_UNSUPPORTED,
    "n": (1,),
}
GENERATE_TOP_UNSUPPORTED: dict[str, tuple[Any, ...]] = {  # beside sampling_params
    "return_logprob": (False,),
    "return_hidden_states": (False,),
}
DEFAULT_MODEL_NAME = "default"  # SGLang's protocol default: the response's model when the request names none


def _require_object(body: Any, what: str = "request body") -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"{what} must be a JSON object")
    return body


# What SGLang's pydantic request models take for a number or a boolean (pydantic's lax mode, which FastAPI
# validates with): JSON numbers and booleans, and strings that spell one.
_INT_TEXT = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?")
_TRUE_TEXT = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_TEXT = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_int(v: Any) -> int | None:
    """pydantic's int: an int, a bool, a finite float with no fraction, or such a string ("7", " 7 ", "1_000",
    "7.00"); None if it is none of these."""
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and v.is_integer() else None
    if isinstance(v, str):
        text = v.strip()
        if text.isascii() and _INT_TEXT.fullmatch(text):
            return int(text.split(".")[0])
    return None


def lax_float(v: Any) -> float | None:
    """pydantic's float: a number, a bool, or a string Python's float() reads (ASCII: "0.5", " 1e3 ", "inf")."""
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str) and v.isascii():
        try:
            return float(v)
        except ValueError:
            return None
    return None


def lax_bool(v: Any) -> bool | None:
    """pydantic's bool: a bool, 0 or 1 (int or float), or "true"/"false", "yes"/"no", "on"/"off", "1"/"0", ...
    in any case; None if it is none of these."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in _TRUE_TEXT | _FALSE_TEXT:
        return v.lower() in _TRUE_TEXT
    return None


def _opt_int(body: Mapping[str, Any], key: str, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    n = lax_int(v)
    if n is None:
        raise RequestError(f"{key} must be an integer, got {v!r}"[:160], key)
    if lo is not None and n < lo:
        raise RequestError(f"{key} must be >= {lo}, got {n}"[:160], key)
    return n


def _refuse_unsupported(body: Mapping[str, Any], table: Mapping[str, tuple[Any, ...]], prefix: str = "") -> None:
    for key, off in table.items():
        v = body.get(key)
        if v is None or any(type(v) is type(o) or {type(v), type(o)} == {int, float} for o in off if v == o):
            continue
        hint = f"leave it out or send {off[0]!r}" if off else "leave it out"
        raise RequestError(f"{prefix}{key} is not supported by the ddtree reference server ({hint})", prefix + key)


def _logit_bias(body: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]}; keys are decimal token ids (as SGLang reads them)."""
    raw = body.get("logit_bias")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise RequestError("logit_bias must be an object mapping token ids to numbers", "logit_bias")
    bias: dict[int, float] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit() or len(key) > 9:
            raise RequestError(f"logit_bias keys must be token ids, got {key[:20]!r}", "logit_bias")
        # SGLang bounds no bias value; a non-finite one (1e400) would turn every logit into nan here
        bias_value = lax_float(value)
        if bias_value is None or not math.isfinite(bias_value):
            raise RequestError(f"logit_bias values must be finite numbers, got {value!r}"[:120], "logit_bias")
        bias[int(key)] = bias_value
    return tuple(sorted(bias.items()))


def _top_k(body: Mapping[str, Any], temperature: float) -> int:
    """SGLang's top_k: -1 (or absent) for the whole vocabulary, else at least 1 and, with the DDTREE plugin, at most
    2**31 - 1. A greedy request's top_k is not checked: SGLang replaces it with 1 first (`__post_init__`)."""
    top_k = _opt_int(body, "top_k")
    if temperature < GREEDY_BELOW:
        return -1
    if top_k is None or top_k == -1:
        return -1
    if top_k < 1:
        raise RequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.", "top_k")
    refusal = top_k_refusal(top_k)
    if refusal is not None:
        raise RequestError(refusal, "top_k")
    return top_k


def _decoding_fields(
    body: Mapping[str, Any], min_tokens_key: str, temperature: float, max_tokens: int | None
) -> dict[str, Any]:
    """top-k, top-p, min-p, the three penalties, the minimum length and logit_bias, validated as SGLang does."""
    top_p = _opt_float(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise RequestError("top_p must be in (0, 1], got 0", "top_p")
    repetition = _opt_float(body, "repetition_penalty", 0.0, 2.0)
    if repetition == 0.0:
        raise RequestError("repetition_penalty must be in (0, 2], got 0", "repetition_penalty")
    min_tokens = _opt_int(body, min_tokens_key, lo=0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise RequestError(
            f"min_new_tokens must be in [0, max_new_tokens({max_tokens})], got {min_tokens}.", min_tokens_key
        )
    fields: dict[str, Any] = {
        "top_k": _top_k(body, temperature),
        "top_p": 1.0 if top_p is None else top_p,
        "min_p": _opt_float(body, "min_p", 0.0, 1.0) or 0.0,
        "frequency_penalty": _opt_float(body, "frequency_penalty", -2.0, 2.0) or 0.0,
        "presence_penalty": _opt_float(body, "presence_penalty", -2.0, 2.0) or 0.0,
        "repetition_penalty": 1.0 if repetition is None else repetition,
        "min_tokens": min_tokens,
        "logit_bias": _logit_bias(body),
    }
    return fields


def _seed(body: Mapping[str, Any], key: str) -> int | None:
    v = _opt_int(body, key)
    if v is not None and not SEED_RANGE[0] <= v <= SEED_RANGE[1]:
        raise RequestError(f"{key} must be in [-2**63, 2**63 - 1], got {v}"[:160], key)
    return v


def _opt_float(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    x = lax_float(v)
    if x is None or not math.isfinite(x):
        raise RequestError(f"{key} must be a number, got {v!r}"[:160], key)
    if not lo <= x <= hi:
        raise RequestError(f"{key} must be in [{lo}, {hi}], got {x}", key)
    return x


def _temperature(body: Mapping[str, Any]) -> float | None:
    """SGLang's check: a non-negative finite number (no upper bound)."""
    v = body.get("temperature")
    if v is None:
        return None
    x = lax_float(v)
    if x is None or not math.isfinite(x) or x < 0:
        raise RequestError(f"temperature must be a non-negative finite number, got {v!r}."[:120], "temperature")
    return x


def _refuse_null(body: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    """Fields SGLang's pydantic model declares without Optional: an explicit null is a 400 there."""
    for key in keys:
        if key in body and body[key] is None:
            raise RequestError(f"{key}: Input should not be null", key)


def _opt_bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    b = lax_bool(v)
    if b is None:
        raise RequestError(f"{key} must be true or false, got {v!r}"[:160], key)
    return b


def token_ids(v: Any, key: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise RequestError(f"{key} must be a list of integer token ids", key)
    if any(t < 0 for t in v):
        raise RequestError(f"{key} must not contain negative token ids", key)
    return tuple(v)


def _stop_token_ids(v: Any) -> tuple[int, ...]:
    """stop_token_ids: a list of integers (OpenAI endpoints: pydantic's List[int], each as `lax_int` reads it). SGLang
    checks no range: a negative id or one beyond the vocabulary is kept and never matches."""
    if not v:
        return ()
    ids = [lax_int(t) for t in v] if isinstance(v, list) else [None]
    if any(t is None for t in ids):
        raise RequestError("stop_token_ids must be a list of integer token ids", "stop_token_ids")
    return tuple(t for t in ids if t is not None)


def _stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise RequestError("stop must be a string or a list of strings", "stop")
    if len(v) > MAX_STOP_COUNT:
        raise RequestError(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(v)}", "stop")
    if any(s == "" for s in v):
        raise RequestError("stop strings must not be empty", "stop")
    return tuple(v)


def _model(body: Mapping[str, Any]) -> str | None:
    v = body.get("model")
    if v is not None and not isinstance(v, str):
        raise RequestError("model must be a string", "model")
    return v


def _n(body: Mapping[str, Any]) -> None:
    n = _opt_int(body, "n", lo=1)
    if n not in (None, 1):
        raise RequestError("only n=1 is supported", "n")


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _opt_bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        include_usage = _opt_bool(_require_object(opts, "stream_options"), "include_usage")
    return stream, include_usage


def _openai_sampling(body: Mapping[str, Any], max_key_names: tuple[str, ...], default_max: int | None) -> Sampling:
    # chat: `max_completion_tokens or max_tokens`, as SGLang's to_sampling_params (a 0 falls through to the other)
    limits = [_opt_int(body, key, lo=0) for key in max_key_names]
    max_tokens = limits[0]
    for later in limits[1:]:
        max_tokens = max_tokens or later
    if max_tokens is None:
        max_tokens = default_max
    return _sampling(body, max_tokens, seed_key="seed", min_key="min_tokens")


def _sampling(fields: Mapping[str, Any], max_tokens: int | None, seed_key: str, min_key: str) -> Sampling:
    """The sampling fields every endpoint shares, read from its body (OpenAI) or `sampling_params` (/generate),
    whose names differ only for the seed and the minimum length."""
    given = _temperature(fields)
    temperature = 1.0 if given is None else given
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        seed=_seed(fields, seed_key),
        stop=_stop(fields.get("stop")),
        stop_token_ids=_stop_token_ids(fields.get("stop_token_ids")),
        ignore_eos=_opt_bool(fields, "ignore_eos"),
        no_stop_trim=_opt_bool(fields, "no_stop_trim"),
        **_decoding_fields(fields, min_key, temperature, max_tokens),
    )


def _message(m: Any, i: int) -> ChatMessage:
    if not isinstance(m, dict):
        raise RequestError(f"messages[{i}] must be an object", "messages")
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool", "developer"):
        raise RequestError(f"messages[{i}].role must be system, user, assistant or tool; got {role!r}", "messages")
    content = m.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):  # OpenAI content parts: only text parts are supported here
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise RequestError(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return ChatMessage(role=role, content=content)


def parse_chat(body: Any) -> ChatRequest:
    body = _require_object(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("messages must be a non-empty list", "messages")
    _n(body)
    _refuse_null(body, _CHAT_NOT_NULL)
    _refuse_unsupported(body, CHAT_UNSUPPORTED)
    raw_kwargs = body.get("chat_template_kwargs")
    kwargs = {} if raw_kwargs is None else dict(_require_object(raw_kwargs, "chat_template_kwargs"))
    stream, include_usage = _stream(body)
    return ChatRequest(
        model=_model(body),
        messages=tuple(_message(m, i) for i, m in enumerate(msgs)),
        sampling=_openai_sampling(body, ("max_completion_tokens", "max_tokens"), None),
        stream=stream,
        include_usage=include_usage,
        chat_template_kwargs=kwargs,
        separate_reasoning=_opt_bool(body, "separate_reasoning", default=True),
        continue_final_message=_opt_bool(body, "continue_final_message"),
        lora_path=body.get("lora_path"),
    )


def parse_completion(body: Any) -> CompletionRequest:
    body = _require_object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and any(isinstance(p, str | list) for p in prompt):
        raise RequestError("prompt batches are not supported: send one prompt per request", "prompt")
    if isinstance(prompt, list):
        parsed: str | tuple[int, ...] = token_ids(prompt, "prompt")
        if not parsed:
            raise RequestError("prompt must not be empty", "prompt")
    elif isinstance(prompt, str):
        parsed = prompt
    else:
        raise RequestError("prompt must be a string or a list of token ids", "prompt")
    _n(body)
    if body.get("echo"):
        raise RequestError("echo is not supported", "echo")
    _refuse_null(body, _COMPLETION_NOT_NULL)
    _refuse_unsupported(body, COMPLETION_UNSUPPORTED)
    stream, include_usage = _stream(body)
    if _opt_int(body, "max_tokens") == 0:  # SGLang's CompletionRequest validator (chat allows 0)
        raise RequestError("max_tokens must be positive", "max_tokens")
    sampling = _openai_sampling(body, ("max_tokens",), COMPLETIONS_DEFAULT_MAX_TOKENS)
    return CompletionRequest(
        model=_model(body),
        prompt=parsed,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        lora_path=body.get("lora_path"),
    )


def parse_generate(body: Any) -> GenerateRequest:
    """SGLang's native /generate: ``{"text" | "input_ids", "sampling_params": {...}, "stream"}``."""
    body = _require_object(body)
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("exactly one of text or input_ids is required", "input_ids")
    if text is not None and not isinstance(text, str):
        raise RequestError("text must be a string (batches are not supported)", "text")
    input_ids = token_ids(ids, "input_ids") if ids is not None else None
    if input_ids is not None and not input_ids:
        raise RequestError("input_ids must not be empty", "input_ids")
    sp = _require_object(body.get("sampling_params") or {}, "sampling_params")
    _refuse_unsupported(sp, GENERATE_UNSUPPORTED, "sampling_params.")  # fields SGLang has: no SGLang shape to keep
    _generate_contract(sp)
    stream = _generate_stream(body)
    try:
        sampling = _generate_sampling(sp)
    except RequestError as exc:
        raise exc.native(stream) from None
    _refuse_unsupported(body, GENERATE_TOP_UNSUPPORTED)
    return GenerateRequest(
        text=text,
        input_ids=input_ids,
        sampling=sampling,
        stream=stream,
        lora_path=body.get("lora_path"),
    )


def _generate_stream(body: Mapping[str, Any]) -> bool:
    v = body.get("stream")
    if v is not None and not isinstance(v, bool):  # SGLang's contract: a JSON boolean
        raise RequestError(f"invalid type: {_unexpected(v)}, expected a boolean", "stream", shape="contract")
    return bool(v)


def _generate_contract(sp: Mapping[str, Any]) -> None:
    """SGLang's /generate JSON contract for sampling_params (`decode_SamplingParams`): known keys only, integers
    that are JSON integers (5.0 is not), numbers, booleans; a 400 `{"error": "<serde's text>"}`."""
    for key, v in sp.items():
        if key not in GENERATE_SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in GENERATE_SAMPLING_FIELDS)
            raise RequestError(f"unknown field `{key}`, expected one of {listed}"[:2000], key, shape="contract")
        if v is None:
            continue
        if key in _GENERATE_INTS and (isinstance(v, bool) or not isinstance(v, int)):
            raise RequestError(f"invalid type: {_unexpected(v)}, expected i64", key, shape="contract")
        if key in _GENERATE_FLOATS and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise RequestError(f"invalid type: {_unexpected(v)}, expected f64", key, shape="contract")
        if key in _GENERATE_BOOLS and not isinstance(v, bool):
            raise RequestError(f"invalid type: {_unexpected(v)}, expected a boolean", key, shape="contract")
        if key == "stop_token_ids":
            if not isinstance(v, list):
                raise RequestError(f"invalid type: {_unexpected(v)}, expected a sequence", key, shape="contract")
            for t in v:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise RequestError(f"invalid type: {_unexpected(t)}, expected i64", key, shape="contract")
        if key == "logit_bias":
            if not isinstance(v, dict):
                raise RequestError(f"invalid type: {_unexpected(v)}, expected a map", key, shape="contract")
            for b in v.values():
                if isinstance(b, bool) or not isinstance(b, int | float):
                    raise RequestError(f"invalid type: {_unexpected(b)}, expected f64", key, shape="contract")


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display, as SGLang's contract error words a value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v[:40]}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


def _generate_sampling(sp: Mapping[str, Any]) -> Sampling:
    max_new = _opt_int(sp, "max_new_tokens", lo=0)
    max_tokens = GENERATE_DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
    return _sampling(sp, max_tokens, seed_key="sampling_seed", min_key="min_new_tokens")


def parse_tokenize(body: Any) -> TokenizeRequest:
    """SGLang's /tokenize (``prompt``), plus ``messages`` for the chat-templated ids opsctl compares."""
    body = _require_object(body)
    prompt, msgs = body.get("prompt"), body.get("messages")
    if (prompt is None) == (msgs is None):
        raise RequestError("exactly one of prompt or messages is required", "prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise RequestError("prompt must be a string", "prompt")
    messages = None
    if msgs is not None:
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("messages must be a non-empty list", "messages")
        messages = tuple(_message(m, i) for i, m in enumerate(msgs))
    raw_kwargs = body.get("chat_template_kwargs")
    return TokenizeRequest(
        model=_model(body),
        prompt=prompt,
        messages=messages,
        add_special_tokens=_opt_bool(body, "add_special_tokens", default=False),
        chat_template_kwargs={} if raw_kwargs is None else dict(_require_object(raw_kwargs, "chat_template_kwargs")),
    )


def _replace_max(s: Sampling, max_tokens: int) -> Sampling:
    return dataclasses.replace(s, max_tokens=max_tokens)


def resolve_max_tokens(requested: int | None, prompt_len: int, context_len: int) -> int:
    """Tokens to generate, or a 400 worded like SGLang's when prompt + completion exceed the context."""
    if prompt_len >= context_len:
        raise RequestError(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context_len} tokens).",
            "messages",
        )
    if requested is None:
        return context_len - prompt_len
    if prompt_len + requested > context_len:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {prompt_len + requested} tokens: {prompt_len} tokens from the input "
            f"messages and {requested} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit.",
            "max_tokens",
        )
    return requested


def refuse_lora(model: str | None, lora_path: Any, served_name: str) -> None:
    """SGLang resolves a LoRA adapter from ``model: "base:adapter"`` first, then ``lora_path``; without
    ``--enable-lora`` any adapter is a 400. This engine has no LoRA at all, so that 400 is the only answer."""
    if lora_path is not None and not isinstance(lora_path, str | list):
        raise RequestError("lora_path must be a string or a list of strings", "lora_path")
    adapter: Any = None
    param = "lora_path"
    if model is not None and ":" in model and model != served_name:  # SGLang's _parse_model_parameter
        rest = model[len(served_name) + 1 :] if model.startswith(f"{served_name}:") else model.split(":", 1)[1]
        adapter = rest.strip() or None
        param = "model" if adapter is not None else param
    if adapter is None:
        if not lora_path:
            return
        adapter = lora_path if isinstance(lora_path, str) else next((a for a in lora_path if a), None)
    raise RequestError(
        f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled (the ddtree reference server has no "
        "LoRA support: leave lora_path out and put no ':adapter' in model)",
        param,
    )


def lone_surrogate(body: Any) -> str | None:
    """What orjson (SGLang's JSON parser) says about a lone UTF-16 surrogate anywhere in the body, else None.
    Python's json accepts ``"\\udfff"``; a tokenizer then fails on it, so the body is refused whole, as SGLang
    refuses it. Iterative: the body may be nested as deep as json.loads allowed."""
    stack = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                ch = ord(v[exc.start])
                return "invalid high surrogate in string" if ch >= 0xDC00 else "no low surrogate in string"
    return None
