"""ddtree.serve request validation and statistics (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ddtree.serve.chat import final_assistant
from ddtree.serve.protocol import (
    ChatMessage,
    RequestError,
    lone_surrogate,
    parse_chat,
    parse_completion,
    parse_generate,
    parse_tokenize,
    refuse_lora,
    resolve_max_tokens,
)
from ddtree.serve.stats import DecodeWindow, ServerStats, decode_batch_line
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.runtime

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_chat_fields() -> None:
    r = parse_chat(
        {
            **CHAT,
            "model": "m",
            "max_tokens": 8,
            "temperature": 0,
            "seed": 3,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    assert (r.model, r.sampling.max_tokens, r.sampling.temperature, r.sampling.seed) == ("m", 8, 0.0, 3)
    assert r.sampling.stop == ("x",) and r.stream and r.include_usage
    assert r.chat_template_kwargs == {"enable_thinking": False}
    assert parse_chat(CHAT).sampling.max_tokens is None and parse_chat(CHAT).sampling.temperature == 1.0
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert parse_chat(parts).messages[0].content == "ab"
    assert parse_chat({**CHAT, "max_completion_tokens": 5, "max_tokens": 9}).sampling.max_tokens == 5


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ([1, 2], None, "must be a JSON object"),
        ({}, "messages", "non-empty list"),
        ({**CHAT, "max_tokens": -1}, "max_tokens", "must be >= 0"),
        ({**CHAT, "max_completion_tokens": -2}, "max_completion_tokens", "must be >= 0"),
        ({**CHAT, "max_tokens": "ten"}, "max_tokens", "must be an integer"),  # "10" and true are 10 and 1 (pydantic)
        ({**CHAT, "max_tokens": 5.5}, "max_tokens", "must be an integer"),
        ({**CHAT, "temperature": -0.5}, "temperature", "non-negative finite"),
        ({**CHAT, "stop": [1]}, "stop", "string or a list of strings"),
        ({**CHAT, "stop": [""]}, "stop", "must not be empty"),
        ({**CHAT, "n": 2}, "n", "only n=1"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "role must be"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", "only text parts"),
        ({**CHAT, "stream": "maybe"}, "stream", "true or false"),  # "yes" is true (pydantic)
        ({**CHAT, "chat_template_kwargs": []}, None, "must be a JSON object"),
    ],
)
def test_chat_rejects(body: Any, param: str | None, fragment: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse_chat(body)
    assert exc.value.status == 400 and exc.value.param == param and fragment in exc.value.message


def test_completion_and_generate() -> None:
    c = parse_completion({"prompt": "hello"})
    assert c.prompt == "hello" and c.sampling.max_tokens == 16  # OpenAI's default
    assert parse_completion({"prompt": [[1, 2, 3]], "max_tokens": 4}).prompt == (1, 2, 3)
    with pytest.raises(RequestError, match="batches are not supported"):
        parse_completion({"prompt": ["a", "b"]})
    with pytest.raises(RequestError, match="negative"):
        parse_completion({"prompt": [1, -2]})
    g = parse_generate({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert g.input_ids == (5, 6) and g.sampling.max_tokens == 3 and g.sampling.temperature == 0.0
    assert parse_generate({"text": "x"}).sampling.max_tokens == 128  # SGLang's default
    with pytest.raises(RequestError, match="exactly one of text or input_ids"):
        parse_generate({"text": "x", "input_ids": [1]})
    assert parse_generate({"text": "x", "sampling_params": {"max_new_tokens": 0}}).sampling.max_tokens == 0
    with pytest.raises(RequestError, match="max_new_tokens must be >= 0"):
        parse_generate({"input_ids": [1], "sampling_params": {"max_new_tokens": -4}})


def test_tokenize_request() -> None:
    t = parse_tokenize({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": 1}})
    assert t.prompt is None and t.messages is not None and t.messages[0].content == "hi"
    assert t.chat_template_kwargs == {"x": 1} and t.add_special_tokens is False
    assert parse_tokenize({"prompt": "hi", "add_special_tokens": True}).add_special_tokens is True
    with pytest.raises(RequestError, match="exactly one of prompt or messages"):
        parse_tokenize({})
    with pytest.raises(RequestError, match="prompt must be a string"):
        parse_tokenize({"prompt": [1, 2]})


def test_max_tokens_against_context() -> None:
    assert resolve_max_tokens(None, 10, 64) == 54
    assert resolve_max_tokens(54, 10, 64) == 54
    with pytest.raises(RequestError, match="maximum context length of 64 tokens") as exc:
        resolve_max_tokens(10**9, 10, 64)
    assert exc.value.param == "max_tokens"
    with pytest.raises(RequestError, match="longer than the model's context length"):
        resolve_max_tokens(1, 64, 64)


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (parse_chat, {**CHAT, "logprobs": True}, "logprobs"),
        (parse_chat, {**CHAT, "logprobs": 0}, "logprobs"),  # a number is not the boolean off
        (parse_chat, {**CHAT, "tools": [{"type": "function"}]}, "tools"),
        (parse_chat, {**CHAT, "presence_penalty": 2.1}, "presence_penalty"),
        (parse_chat, {**CHAT, "top_p": 0}, "top_p"),
        (parse_chat, {**CHAT, "logit_bias": {"-1": 3}}, "logit_bias"),
        (parse_chat, {**CHAT, "logit_bias": [1]}, "logit_bias"),
        (parse_chat, {**CHAT, "min_tokens": -1}, "min_tokens"),
        (parse_completion, {"prompt": "x", "logprobs": 0}, "logprobs"),
        (parse_generate, {"text": "x", "sampling_params": {"regex": "a"}}, "sampling_params.regex"),
        (parse_generate, {"text": "x", "sampling_params": {"top_k": -3}}, "top_k"),
        (parse_chat, {**CHAT, "seed": 2**63}, "seed"),  # SGLang's range ends at 2**63 - 1
        (parse_generate, {"text": "x", "sampling_params": {"sampling_seed": -(2**63) - 1}}, "sampling_seed"),
    ],
)
def test_unsupported_fields_and_seed_range(parse: Any, body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as exc:
        parse(body)
    assert exc.value.status == 400 and exc.value.param == param and param in exc.value.message


def test_sampling_fields_are_parsed() -> None:
    body = {**CHAT, "top_p": 0.9, "min_p": 0.1, "frequency_penalty": -0.5, "presence_penalty": 1.0,
            "repetition_penalty": 1.3, "top_k": 40, "min_tokens": 4, "logit_bias": {"7": -100, "12": 2}}  # fmt: skip
    s = parse_chat(body).sampling
    assert (s.top_k, s.top_p, s.min_p, s.min_tokens) == (40, 0.9, 0.1, 4)
    assert (s.frequency_penalty, s.presence_penalty, s.repetition_penalty) == (-0.5, 1.0, 1.3)
    assert s.logit_bias == ((7, -100.0), (12, 2.0))
    g = parse_generate({"text": "x", "sampling_params": {"min_new_tokens": 3, "top_k": -1}}).sampling
    assert (g.min_tokens, g.top_k) == (3, -1)
    # greedy: SGLang replaces top_k with 1 before checking it, so any top_k passes
    assert parse_generate({"text": "x", "sampling_params": {"temperature": 0, "top_k": 0}}).sampling.top_k == -1


def test_off_values_of_unsupported_fields_pass() -> None:
    off = {"logprobs": False, "tools": [], "tool_choice": "auto", "repetition_penalty": 1.0, "top_k": -1}
    r = parse_chat({**CHAT, **off, "model": "anything", "top_p": 0.5, "temperature": 0, "seed": 2**63 - 1})
    assert r.model == "anything" and r.sampling.seed == 2**63 - 1 and r.sampling.temperature == 0.0


def test_decode_batch_line_matches_sglang() -> None:
    w = DecodeWindow(1, 300, 0.07, 3.25, 0.45, 41.5, 2)
    assert decode_batch_line(w) == (
        "Decode batch, #running-req: 1, #token: 300, token usage: 0.07, accept len: 3.25, accept rate: 0.45, "
        "cuda graph: False, gen throughput (token/s): 41.50, #queue-req: 2"
    )
    base = DecodeWindow(1, 12, 0.0, None, None, 9.0, 0)
    assert decode_batch_line(base) == (
        "Decode batch, #running-req: 1, #token: 12, token usage: 0.00, cuda graph: False, "
        "gen throughput (token/s): 9.00, #queue-req: 0"
    )


def test_stats_windows_and_prometheus_text() -> None:
    lines: list[str] = []
    s = ServerStats("m", context_len=100, speculative=True, draft_tokens_per_round=3, log_every=2, emit=lines.append)
    s.set_queue(1)
    s.on_start(prompt_len=10)
    s.on_first_token(1, seconds=0.1)  # the prefill's token: generated, but not a decode round
    for committed in (4, 2, 3):
        s.on_round(committed, seconds=0.5)
    s.on_finish(2.0)
    assert lines == [
        "Decode batch, #running-req: 1, #token: 17, token usage: 0.17, accept len: 3.00, accept rate: 0.67, "
        "cuda graph: False, gen throughput (token/s): 6.00, #queue-req: 1"
    ]
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(s.registry).decode())}
    value = {f: families[f].samples[0].value for f in families}
    assert value["sglang:prompt_tokens"] == 10 and value["sglang:generation_tokens"] == 10
    assert value["sglang:spec_accept_length"] == 3.0 and value["sglang:num_queue_reqs"] == 1
    assert value["sglang:num_running_reqs"] == 0 and value["sglang:num_requests"] == 1
    assert families["sglang:prompt_tokens"].samples[0].labels == {"model_name": "m"}


def test_lone_surrogates_are_found_anywhere_as_orjson_words_it() -> None:
    assert lone_surrogate({"messages": [{"role": "user", "content": "ok \U0001f600"}], "n": 1}) is None
    assert lone_surrogate({"a": [{"b": ["x", "y\udfff"]}]}) == "invalid high surrogate in string"
    assert lone_surrogate({"k\ud800": 1}) == "no low surrogate in string"  # keys too
    deep: Any = "\udc00"
    for _ in range(5000):  # deeper than Python's recursion limit: the walk is iterative
        deep = [deep]
    assert lone_surrogate(deep) == "invalid high surrogate in string"


@pytest.mark.parametrize(
    ("model", "lora_path", "param", "adapter"),
    [
        ("tiny:ad", None, "model", "ad"),  # SGLang's base:adapter syntax, the served name as base
        ("other:x", None, "model", "x"),
        (None, "my-lora", "lora_path", "my-lora"),
        ("tiny", [None, "b"], "lora_path", "b"),
        (None, 5, "lora_path", None),
    ],
)
def test_lora_is_refused_as_sglang_refuses_it_without_enable_lora(
    model: str | None, lora_path: Any, param: str, adapter: str | None
) -> None:
    with pytest.raises(RequestError) as exc:
        refuse_lora(model, lora_path, "tiny")
    assert exc.value.param == param and exc.value.status == 400
    if adapter is not None:
        assert exc.value.message.startswith(f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled")


def test_no_lora_passes() -> None:
    for model, lora_path in ((None, None), ("tiny", None), ("tiny", ""), ("a:", []), ("gpt-4o", None)):
        refuse_lora(model, lora_path, "tiny")


def test_sglang_request_fields() -> None:
    chat = parse_chat({**CHAT, "no_stop_trim": True, "continue_final_message": True, "return_hidden_states": False})
    assert chat.sampling.no_stop_trim and chat.continue_final_message
    assert parse_generate({"text": "x", "sampling_params": {"no_stop_trim": True}}).sampling.no_stop_trim
    assert not parse_completion({"prompt": "x"}).sampling.no_stop_trim
    for parse, body, param in (
        (parse_chat, {**CHAT, "return_hidden_states": True}, "return_hidden_states"),
        (parse_completion, {"prompt": "x", "return_hidden_states": "last"}, "return_hidden_states"),
        (parse_generate, {"text": "x", "return_hidden_states": True}, "return_hidden_states"),
        (parse_chat, {**CHAT, "continue_final_message": "maybe"}, "continue_final_message"),  # "yes" is true
    ):
        with pytest.raises(RequestError) as exc:
            parse(body)
        assert exc.value.param == param, body


def test_final_assistant_message_as_sglang_handles_it() -> None:
    user, asst = ChatMessage("user", "q"), ChatMessage("assistant", "The answer is")
    assert final_assistant([user, asst], continue_final=True) == ([user], "The answer is")
    assert final_assistant([user, asst], continue_final=False) == ([user, ChatMessage("user", "The answer is")], None)
    assert final_assistant([user], continue_final=True) == ([user], None)


_lone = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])  # st.characters() never yields surrogates
_any_text = st.text(st.characters() | _lone, max_size=6)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_any_text, inner, max_size=4),
    max_leaves=20,
)


@given(_json_values)
def test_lone_surrogate_iff_the_body_is_not_valid_unicode(body: Any) -> None:
    """Whatever the shape: refused exactly when the body cannot be written as UTF-8 (what orjson refuses)."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
        valid = True
    except UnicodeEncodeError:
        valid = False
    assert (lone_surrogate(body) is None) == valid


def test_generate_refusals_carry_sglangs_shape_and_whether_they_stream() -> None:
    """/generate: the JSON contract's refusals are "contract" (400 before any stream), the range checks "native",
    and a streamed request's native refusal is answered in its stream (SGLang: HTTP 200, one error event)."""
    with pytest.raises(RequestError) as contract:
        parse_generate({"text": "x", "stream": True, "sampling_params": {"sampling_seed": 5.0}})
    assert (contract.value.shape, contract.value.stream) == ("contract", False)
    for stream in (False, True):
        with pytest.raises(RequestError) as native:
            parse_generate({"text": "x", "stream": stream, "sampling_params": {"top_k": 0, "temperature": 1}})
        assert (native.value.shape, native.value.stream) == ("native", stream)
    with pytest.raises(RequestError) as openai_shaped:
        parse_chat({**CHAT, "top_k": 0, "stream": True})  # chat checks before its stream starts: a 400
    assert (openai_shaped.value.shape, openai_shaped.value.stream) == ("openai", False)
