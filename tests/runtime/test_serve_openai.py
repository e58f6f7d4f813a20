"""The reference server as the official `openai` client sees it, next to SGLang 0.5.23: any model name, models.retrieve,
unsupported fields refused by name, numeric overflow and deep nesting as 400s, and x-request-id. Plus raw HTTP
for the hostile requests a client library would not send. One baseline server on the tiny dense model."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from test_serve_http import API_KEY, ServeProcess

pytestmark = pytest.mark.runtime

MESSAGES: Any = [{"role": "user", "content": "What is 2+2?"}]
SGLANG_ERROR_KEYS = {"object", "message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(tiny_dense: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    s = ServeProcess.start(Path(tiny_dense), "baseline", tmp_path_factory.mktemp("serve-openai"))
    try:
        yield s.wait_ready()
    finally:
        assert s.stop() == 0, s.stderr()[-3000:]


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _assert_sglang_400(r: httpx.Response, param: str | None, fragment: str) -> None:
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == SGLANG_ERROR_KEYS and body["object"] == "error" and body["code"] == 400, body
    assert body["param"] == param and fragment in body["message"], body


def test_any_model_name_is_accepted_and_the_served_name_reported(client: openai.OpenAI) -> None:
    ref = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    other = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=6, temperature=0)
    assert other.model == "tiny" and ref.model == "tiny"
    assert other.choices[0].message == ref.choices[0].message  # greedy: the name changes nothing
    done = client.completions.create(
        model="no/such-model", prompt="Once", max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert done.model == "tiny" and done.usage is not None and done.usage.completion_tokens == 3


def test_models_list_and_retrieve(client: openai.OpenAI, server: ServeProcess) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    card = client.models.retrieve("tiny")
    assert (card.id, card.object, card.owned_by) == ("tiny", "model", "sglang")
    assert card.model_extra is not None and card.model_extra["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("gpt-4")
    assert exc.value.status_code == 404
    assert exc.value.body == {  # SGLang 0.5.23's body for an unknown id, under "error"
        "message": "The model 'gpt-4' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    # the model path is not an id here, as in SGLang (only the served name is)
    assert httpx.get(f"{server.url}/v1/models/{server.models}/target", headers=server.headers).status_code == 404


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1.0}, "frequency_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"top_p": 0.5}, "top_p"),
        ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"extra_body": {"regex": "[0-9]+"}}, "regex"),
    ],
)
def test_unsupported_chat_fields_are_400_naming_the_field(
    client: openai.OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, **kwargs)
    assert exc.value.status_code == 400
    assert isinstance(exc.value.body, dict) and exc.value.body["param"] == param
    assert f"{param} is not supported" in exc.value.body["message"]


def test_neutral_values_of_unsupported_fields_are_accepted(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=2,
        temperature=0,
        top_p=0.5,  # greedy: top_p changes nothing, so it is not refused
        logprobs=False,
        presence_penalty=0,
        frequency_penalty=0.0,
        tool_choice="none",
        response_format={"type": "text"},
        extra_body={"repetition_penalty": 1.0, "top_k": -1, "min_p": 0.0},
    )
    assert done.usage is not None and done.usage.completion_tokens == 2
    assert done.choices[0].logprobs is None


def test_unsupported_completion_and_generate_fields(client: openai.OpenAI, server: ServeProcess) -> None:
    for kwargs, param in (({"logprobs": 1}, "logprobs"), ({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model="tiny", prompt="Once", max_tokens=2, **kwargs)
        assert isinstance(exc.value.body, dict) and exc.value.body["param"] == param, exc.value.body
    base = {"text": "Once", "sampling_params": {"max_new_tokens": 2}}
    r = server.post("/generate", {**base, "sampling_params": {"max_new_tokens": 2, "frequency_penalty": 0.3}})
    _assert_sglang_400(r, "sampling_params.frequency_penalty", "not supported")
    _assert_sglang_400(server.post("/generate", {**base, "return_logprob": True}), "return_logprob", "not supported")


@pytest.mark.parametrize(
    ("path", "body", "param", "fragment"),
    [
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "seed": %d}' % 2**64, "seed",
         "64 bits"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "seed": %d}' % -(2**63 + 1),
         "seed", "64 bits"),
        ("/v1/completions", b'{"prompt": "hi", "seed": 1%s}' % (b"0" * 400), "seed", "64 bits"),
        ("/generate", b'{"text": "hi", "sampling_params": {"seed": %d}}' % 2**70, "seed", "64 bits"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1%s}' % (b"0" * 30), "max_tokens",
         "maximum context length"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1e400}', "max_tokens", "must be an integer"),
        ("/v1/completions", b'{"prompt": "hi", "temperature": -1e400}', "temperature", "must be a number"),
        ("/generate", b'{"input_ids": [%d]}' % 2**70, "input_ids", "outside the vocabulary"),
        ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, None, "nested too deeply"),
        ("/v1/chat/completions", b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", None, "nested too deeply"),
        ("/generate", b'{"text": ' + b'{"a": ' * 20_000 + b"1" + b"}" * 20_001, None, "nested too deeply"),
    ],
)  # fmt: skip
def test_hostile_numbers_and_nesting_are_400_in_sglang_shape(
    server: ServeProcess, path: str, body: bytes, param: str | None, fragment: str
) -> None:
    _assert_sglang_400(server.post(path, body), param, fragment)


def test_seed_at_the_64_bit_edges_works(server: ServeProcess) -> None:
    for seed in (2**64 - 1, -(2**63)):
        body = {"prompt": "Once", "max_tokens": 3, "temperature": 1.0, "seed": seed}
        replies = [server.post("/v1/completions", body) for _ in range(2)]
        assert [r.status_code for r in replies] == [200, 200], replies[0].text
        assert replies[0].json()["choices"][0]["text"] == replies[1].json()["choices"][0]["text"]


def test_request_id_echoed_or_generated(client: openai.OpenAI, server: ServeProcess) -> None:
    sent = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=1, extra_headers={"X-Request-ID": "trace-42/abc"}
    )
    assert sent.headers["x-request-id"] == "trace-42/abc" and sent.parse()._request_id == "trace-42/abc"
    fresh = [client.models.with_raw_response.list().headers["x-request-id"] for _ in range(2)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in fresh) and fresh[0] != fresh[1], fresh
    for bad in ("x" * 129, "has space", "tab\there", ""):  # too long, not printable: replaced, never echoed
        r = httpx.get(f"{server.url}/v1/models", headers={**server.headers, "x-request-id": bad})
        assert r.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), bad
    assert (
        httpx.get(f"{server.url}/v1/models", headers={**server.headers, "x-request-id": "x" * 128}).headers[
            "x-request-id"
        ]
        == "x" * 128
    )
    # on errors too: the client's exception carries it, and a 401 (before any route) has one
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, logprobs=True, extra_headers={"x-request-id": "e1"}
        )
    assert exc.value.request_id == "e1"
    unauthorized = httpx.get(f"{server.url}/v1/models", headers={"x-request-id": "no-key"})
    assert unauthorized.status_code == 401 and unauthorized.headers["x-request-id"] == "no-key"
    assert httpx.get(f"{server.url}/health").headers["x-request-id"]
    # and on a stream: the header comes with the first bytes
    with client.chat.completions.with_streaming_response.create(
        model="tiny", messages=MESSAGES, max_tokens=2, stream=True, extra_headers={"x-request-id": "s1"}
    ) as stream:
        assert stream.headers["x-request-id"] == "s1"
        assert sum(1 for _ in stream.iter_lines()) > 2
