"""The sampling rules of SGLang 0.5.23, read from its own code, against the reference server's and the plugin's.

One SGLang probe (conftest.py, `sglang_probes`) judges a generated table of hostile sampling requests exactly as
SGLang's HTTP server does before a request reaches the scheduler: the OpenAI endpoints' pydantic request models
(`ChatCompletionRequest`, `CompletionRequest`, `to_sampling_params` / `_build_sampling_params`), /generate's JSON
contract (`generate_contract_error`), then `SamplingParams(...)`, `normalize` and `verify`, with the DDTREE plugin
loaded through SGLang's own `load_plugins()`. Each verdict (status, and per endpoint the error's shape) must be the
reference server's (`ddtree.serve.protocol`), strings that pydantic reads as numbers included.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ddtree.serve.protocol import RequestError, parse_chat, parse_completion, parse_generate
from ddtree.sglang.sampling_guard import TOP_K_MAX

from opsctl import smoke
from opsctl.errors import SmokeError

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sglang_cpu import Probe, ProbeResult  # noqa: E402

sys.path.remove(str(HERE))

VOCAB = 1000  # every logit_bias key of the table is below it (the app checks keys against the real vocabulary)
MESSAGES = [{"role": "user", "content": "hi"}]
# OpenAI name -> /generate's sampling_params name
NATIVE = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "seed": "sampling_seed"}
# JSON numbers at and around each rule's edges, and what pydantic's lax mode makes of strings and booleans
INTS = [-2, -1, 0, 1, 5, 5.0, 5.5, 2**31 - 1, 2**31, 2**63, None]
INTS += [True, False, "5", " 5 ", "5.00", "5.5", "1_000", "-1", "x", "\u0665", [5]]
FLOATS = [-0.5, 0, 1e-7, 0.5, 1, 1.5, 2, 2.5, 7, None]
FLOATS += [True, False, "0.5", " 1e0 ", "inf", "nan", "-0", "x", "1__0", {}]
BOOLS = [True, False, None, "yes", "Off", "T", 1, 0, 2, 1.0, "true ", "x"]
FIELDS: dict[str, list[Any]] = {
    "max_tokens": INTS,
    "min_tokens": INTS,
    "seed": INTS,
    "top_k": INTS,
    "temperature": FLOATS,
    "top_p": FLOATS,
    "min_p": FLOATS,
    "frequency_penalty": FLOATS,
    "presence_penalty": FLOATS,
    "repetition_penalty": FLOATS,
    "stop": [["x"] * 32, ["x"] * 33, "x", None],
    "logit_bias": [{"5": 200}, {"5": -3.5}, {"abc": 1}, {"-1": 1}, {"5": None}, {"5": "2"}, {"5": True}, None],
    "stop_token_ids": [[5], [-1], ["5"], [5.0], [True], [5.5], "5", [], None],
    "ignore_eos": BOOLS,
    "no_stop_trim": BOOLS,
}
# what makes a rule apply: sampled (top_k is not checked when greedy), and length limits to compare against
CONTEXTS: list[dict[str, Any]] = [
    {},
    {"temperature": 0},
    {"temperature": 0.7, "max_tokens": 4},
    {"temperature": 0.7, "min_tokens": 20},
]


def cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for (field, values), context, endpoint in itertools.product(
        FIELDS.items(), CONTEXTS, ("chat", "completions", "generate")
    ):
        for value in values:
            fields = {**context, field: value}
            if endpoint == "generate":
                body: dict[str, Any] = {
                    "text": "hi",
                    "sampling_params": {NATIVE.get(k, k): v for k, v in fields.items()},
                }
            elif endpoint == "chat":
                body = {"messages": MESSAGES, **fields}
            else:
                body = {"prompt": "hi", **fields}
            out.append((endpoint, body))
    out.append(("chat", {"messages": MESSAGES, "max_completion_tokens": 0, "max_tokens": 3, "min_tokens": 4}))
    out.append(("chat", {"messages": MESSAGES, "max_completion_tokens": 5, "max_tokens": 3, "min_tokens": 4}))
    return out


# `opsctl smoke`'s prompt loader (opsctl/smoke.py, `sampling:`): every value it takes must be one SGLang takes
LOADER_VALUES: list[Any] = [-2, -1, 0, 1, 1.5, 2, 2.5, 12, 20, 2**20, 2**31, 2**63, 0.5, 1e-7, True, "1", None]
LOADER_CONTEXTS: list[dict[str, Any]] = [{}, {"temperature": 0.7, "sampling_seed": 5}, {"temperature": 0}]


def loader_cases(tmp: Path) -> list[tuple[bool, dict[str, Any]]]:
    """(the loader took it, the /generate body it sends or would send) for each generated prompt's sampling."""
    out = []
    for i, (key, value, context) in enumerate(itertools.product(smoke.SAMPLING_KEYS, LOADER_VALUES, LOADER_CONTEXTS)):
        sampling = {**context, key: value}
        path = tmp / f"p{i}.yaml"
        path.write_text(
            yaml.safe_dump({"prompts": [{"id": "p", "prompt": "hi", "max_tokens": 16, "sampling": sampling}]})
        )
        try:
            (prompt,) = smoke.load_prompts(path)
        except SmokeError:
            out.append((False, {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 16, **sampling}}))
            continue
        out.append((True, {"text": "hi", "sampling_params": smoke.generate_sampling(prompt)}))
    return out


_PROBE = r"""
import json, sys
from pydantic import ValidationError
from sglang.srt.plugins import load_plugins
load_plugins()  # the DDTREE plugin through its entry point, its hooks applied, as in every SGLang process
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.sampling.sampling_params import SamplingParams

req = json.load(open(sys.argv[1]))

class Tok:  # normalize() measures stop strings with the tokenizer
    def encode(self, s, add_special_tokens=False):
        return list(s.encode())

def checks(sp):  # TokenizerManager._create_tokenized_object's order
    p = SamplingParams(**sp)
    p.normalize(Tok())
    p.verify(req["vocab"])

def verdict(endpoint, body):
    try:
        if endpoint == "generate":
            err = generate_contract_error(body)
            if err is not None:
                return [400, "contract", err]
            sp = body.get("sampling_params") or {}
        else:
            model = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
            try:
                r = model.model_validate(body)
            except ValidationError as e:
                return [400, "openai", str(e)[:300]]
            if endpoint == "chat":
                stop = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
                sp = r.to_sampling_params(stop, {})
            else:
                sp = OpenAIServingCompletion._build_sampling_params(None, r)
        checks(sp)
    except ValueError as e:
        return [400, "native" if endpoint == "generate" else "openai", str(e)[:300]]
    return [200, None, ""]

top_k = {}
for k, t in req["top_k"]:
    try:
        SamplingParams(top_k=k, temperature=t).verify(req["vocab"])
        top_k[f"{k}@{t}"] = "ok"
    except ValueError as e:
        top_k[f"{k}@{t}"] = str(e)
print(json.dumps({
    "verdicts": [verdict(e, b) for e, b in req["cases"]],
    "loader": [verdict("generate", b) for _, b in req["loader"]],
    "top_k": top_k,
    "hooked": hasattr(SamplingParams.verify, "__wrapped__"),
}))
"""

TOP_K_PROBES = [(TOP_K_MAX, 1.0), (TOP_K_MAX + 1, 1.0), (2**40, 0.7), (-1, 1.0), (0, 1.0), (TOP_K_MAX + 1, 0.0)]


def sglang_probe(tmp: Path) -> Probe:
    (tmp / "loader").mkdir()
    request = {"cases": cases(), "vocab": VOCAB, "top_k": TOP_K_PROBES, "loader": loader_cases(tmp / "loader")}
    (tmp / "loader.json").write_text(json.dumps(request["loader"]))
    (tmp / "request.json").write_text(json.dumps(request))
    return Probe(_PROBE, (str(tmp / "request.json"),))


@pytest.fixture(scope="module")
def probe(sglang_probes: dict[str, ProbeResult]) -> dict[str, Any]:
    done = sglang_probes[__name__]
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def reference_verdict(endpoint: str, body: dict[str, Any]) -> tuple[int, str | None]:
    parse = {"chat": parse_chat, "completions": parse_completion, "generate": parse_generate}[endpoint]
    try:
        parse(body)
    except RequestError as exc:
        return exc.status, exc.shape
    return 200, None


def test_the_plugin_makes_sglangs_verify_refuse_top_k_beyond_int32(probe: dict[str, Any]) -> None:
    """SGLang's own SamplingParams.verify, hooked by the plugin: a top_k its int32 tensor cannot hold is the
    ValueError SGLang answers with a 400 (it ended the scheduler before); greedy requests never carry one."""
    assert probe["hooked"]
    got = probe["top_k"]
    assert got[f"{TOP_K_MAX}@1.0"] == "ok" and got["-1@1.0"] == "ok" and got[f"{TOP_K_MAX + 1}@0.0"] == "ok"
    for key in (f"{TOP_K_MAX + 1}@1.0", f"{2**40}@0.7"):
        assert got[key].startswith("top_k must be -1 (disable) or in [1, 2147483647]"), got
    assert got["0@1.0"] == "top_k must be -1 (disable) or at least 1, got 0."  # SGLang's own check, unchanged


def test_the_reference_server_refuses_and_accepts_what_sglang_does(probe: dict[str, Any]) -> None:
    table = cases()
    verdicts = probe["verdicts"]
    assert len(verdicts) == len(table)
    differ = []
    for (endpoint, body), (status, shape, message) in zip(table, verdicts, strict=True):
        mine = reference_verdict(endpoint, body)
        if mine != (status, shape):
            differ.append(f"{endpoint} {json.dumps(body)[:160]}: SGLang {status} {shape} ({message[:80]}), here {mine}")
    refused = sum(v[0] == 400 for v in verdicts)
    assert refused > 100 and len(verdicts) - refused > 100  # the table exercises both answers
    assert not differ, f"{len(differ)} of {len(table)} differ:\n" + "\n".join(differ[:40])


def test_the_smoke_prompt_loader_takes_only_what_sglang_takes(probe: dict[str, Any], tmp_path: Path) -> None:
    """Every `sampling:` the loader accepts is a /generate request SGLang accepts (a prompt file can never fail on
    a service it passed on the reference engine); SGLang's refusals the loader must have made itself."""
    table = loader_cases(tmp_path)
    verdicts = probe["loader"]
    assert len(verdicts) == len(table)
    wrong = [
        f"{json.dumps(body['sampling_params'])}: SGLang {v[0]} ({v[2][:80]})"
        for (took, body), v in zip(table, verdicts, strict=True)
        if took and v[0] != 200
    ]
    assert not wrong, "the loader takes what SGLang refuses:\n" + "\n".join(wrong[:30])
    named = [  # SGLang 0.5.23's refusals the loader once took
        {"temperature": 0.7, "sampling_seed": 1.5},
        {"temperature": 0.7, "sampling_seed": 5, "top_k": 0},
        {"min_new_tokens": 20},
    ]
    for sampling in named:
        (took, _), verdict = next(
            (t, v)
            for t, v in zip(table, verdicts, strict=True)
            if t[1]["sampling_params"] == {"temperature": 0, "max_new_tokens": 16, **sampling}
        )
        assert not took and verdict[0] == 400, (sampling, verdict)
    assert sum(took for took, _ in table) > 50  # the loader's own range is exercised too
