from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import smoke
from opsctl.errors import SmokeError
from opsctl.smoke import Generation


def _body(content="4", reasoning=None, finish="stop", tokens=2):
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": reasoning},
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": 20, "completion_tokens": tokens, "total_tokens": 20 + (tokens or 0)},
    }  # fmt: skip


def test_judge_pass():
    v = smoke.judge_chat(200, _body())
    assert v.ok and v.reasons == () and v.text == "4" and v.finish_reason == "stop" and v.completion_tokens == 2


def test_judge_accepts_reasoning_only_like_qwen36_seed():
    # The seed's first smoke test: content null, text in reasoning_content, cut at max_tokens.
    v = smoke.judge_chat(200, _body(content=None, reasoning="Here's a thinking process:", finish="length", tokens=32))
    assert v.ok and v.text.startswith("Here's a thinking process")


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (503, {"error": {"message": "loading"}}, "HTTP 503: loading"),
        (200, _body(finish="abort"), "finish_reason is 'abort'"),
        (200, _body(finish=None), "finish_reason is None"),
        (200, _body(tokens=0), "completion_tokens is 0"),
        (200, _body(tokens=None), "usage.completion_tokens missing"),
        (200, _body(content="", reasoning=""), "content and reasoning_content are both empty"),
        (200, _body(content="   ", reasoning=None), "content and reasoning_content are both empty"),
        (200, {"choices": []}, "no choices"),
        (200, ["not", "an", "object"], "not a JSON object"),
        (401, None, "HTTP 401"),
    ],
)
def test_judge_failures(status, body, reason):
    v = smoke.judge_chat(status, body)
    assert not v.ok
    assert any(reason in r for r in v.reasons), v.reasons


def test_chat_body_disables_thinking():
    body = smoke.chat_body("m", "hi", 32)
    assert body["temperature"] == 0 and body["max_tokens"] == 32
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_first_divergence():
    assert smoke.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert smoke.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert smoke.first_divergence([1, 2], [1, 2, 3]) == 2
    assert smoke.first_divergence([], []) is None
    assert smoke.first_divergence([5], []) == 0


def test_compare_prefers_tokens_and_falls_back_to_text():
    a = smoke.compare("p", Generation((1, 2, 3), "abc", "generate+text"), Generation((1, 2, 4), "abd", "generate+text"))
    assert not a.equal and a.first_divergence == 2 and a.unit == "tokens"
    b = smoke.compare("p", Generation(None, "hello", "generate+text"), Generation((1,), "help", "generate+text"))
    assert not b.equal and b.first_divergence == 3 and b.unit == "chars"


def test_summarize_equivalence_threshold():
    same = smoke.PromptAgreement("a", True, None, 10, 10, "tokens")
    diff = smoke.PromptAgreement("b", False, 5, 10, 10, "tokens")
    full = smoke.summarize_equivalence("tree", "base", [same, same])
    assert full.passed and full.agreement == 1.0 and full.token_agreement == 1.0
    half = smoke.summarize_equivalence("tree", "base", [same, diff])
    assert not half.passed and half.agreement == 0.5 and half.token_agreement == 15 / 20
    assert smoke.summarize_equivalence("tree", "base", [same, diff], threshold=0.5).passed
    assert not smoke.summarize_equivalence("tree", "base", []).passed


def test_default_prompt_set_is_varied():
    prompts = smoke.load_prompts()
    assert len(prompts) >= 20
    assert len({p.id for p in prompts}) == len(prompts)
    assert len({p.max_tokens for p in prompts}) >= 4
    assert any("JSON" in p.text for p in prompts) and any("Python" in p.text for p in prompts)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("prompts: []", "non-empty list"),
        ("- a\n- b", "expected `prompts:`"),
        ("prompts: [{id: a}]", "non-empty `prompt`"),
        ("prompts: [{prompt: x, colour: red}]", "unknown keys"),
        ("prompts: [{id: a, prompt: x}, {id: a, prompt: y}]", "duplicate id"),
        ("prompts: [{prompt: x, max_tokens: 0}]", "max_tokens"),
        ("prompts: [{prompt: x", "not valid YAML"),
        ("prompts: [{prompt: x, sampling: [1]}]", "sampling must be a mapping"),
        ("prompts: [{prompt: x, sampling: {top_q: 1}}]", "unknown key 'top_q'"),
        ("prompts: [{prompt: x, sampling: {temperature: 0.7}}]", "without a sampling_seed"),
        ("prompts: [{prompt: x, sampling: {temperature: 0.7, min_p: 0.1, sampling_seed: 1}}]", "min_p beside a"),
        ("prompts: [{prompt: x, sampling: {temperature: 3, sampling_seed: 1}}]", "temperature must be a number"),
        ("prompts: [{prompt: x, sampling: {top_p: true}}]", "top_p must be a number"),
        ("prompts: [{prompt: x, sampling: {sampling_seed: -1}}]", "sampling_seed must be an integer"),
        ("prompts: [{prompt: x, sampling: {sampling_seed: 1.5}}]", r"sampling_seed must be an integer in \[0, "),
        ("prompts: [{prompt: x, sampling: {top_k: 0}}]", "top_k is 0"),
        ("prompts: [{prompt: x, sampling: {top_k: 2.0}}]", "top_k must be an integer"),
        ("prompts: [{prompt: x, max_tokens: 8, sampling: {min_new_tokens: 9}}]", "min_new_tokens 9 > max_tokens 8"),
        ("prompts: [{prompt: x, sampling: null}]", "sampling must be a mapping"),
    ],
)
def test_bad_prompt_files(tmp_path: Path, text, msg):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(SmokeError, match=msg):
        smoke.load_prompts(path)


def _sglang_accepts(max_tokens: int, sampling: dict[str, Any]) -> bool:
    """SGLang 0.5.23's SamplingParams rules for the keys a prompt may set, written out independently of the loader
    (plus the loader's own two: a sampled prompt carries its seed; no min_p beside a seed)."""
    ints = {"top_k", "min_new_tokens", "sampling_seed"}
    for key, value in sampling.items():
        lo, hi = smoke.SAMPLING_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
            return False
        if key in ints and not isinstance(value, int):
            return False
    if sampling.get("top_k") == 0 or sampling.get("min_new_tokens", 0) > max_tokens:
        return False
    if sampling.get("temperature", 0) > 0 and "sampling_seed" not in sampling:
        return False
    return not (sampling.get("min_p", 0) > 0 and "sampling_seed" in sampling)


_values = st.one_of(
    st.integers(-3, 5000), st.floats(-3, 5000, allow_nan=False), st.booleans(), st.none(), st.text(max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(
    max_tokens=st.integers(1, 4096),
    sampling=st.dictionaries(st.sampled_from(sorted(smoke.SAMPLING_KEYS)), _values, max_size=4),
)
def test_prompt_loader_accepts_exactly_what_sglang_accepts(tmp_path_factory, max_tokens, sampling):
    path = tmp_path_factory.mktemp("p") / "p.yaml"
    path.write_text(yaml.safe_dump({"prompts": [{"prompt": "x", "max_tokens": max_tokens, "sampling": sampling}]}))
    if _sglang_accepts(max_tokens, sampling):
        (prompt,) = smoke.load_prompts(path)
        assert dict(prompt.sampling) == sampling
    else:
        with pytest.raises(SmokeError) as err:
            smoke.load_prompts(path)
        assert "\n" not in err.value.message and "prompts[0]" in err.value.message


def test_missing_prompt_file(tmp_path: Path):
    with pytest.raises(SmokeError, match="cannot read prompt file"):
        smoke.load_prompts(tmp_path / "nope.yaml")


def _client(handler) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_smoke_service_over_http():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        return httpx.Response(200, json=_body(content="4"))

    with _client(handler) as client:
        r = smoke.smoke_service(client, "h", "s", "http://h:1", {})
    assert r.ok and r.model == "tiny" and r.text == "4"
    assert seen == [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]


def test_generate_uses_input_ids_when_given():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"text": "x", "output_ids": [5, 6], "meta_info": {}})

    with _client(handler) as client:
        g = smoke.generate(client, "http://h:1", smoke.Prompt("a", "hi", 8), {}, [1, 2, 3])
        t = smoke.generate(client, "http://h:1", smoke.Prompt("a", "hi", 8), {}, None)
    assert g.ids == (5, 6) and g.via == "generate+chat-template" and t.via == "generate+chatml"
    assert bodies[0]["input_ids"] == [1, 2, 3] and "text" not in bodies[0]
    assert bodies[1]["text"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert bodies[1]["sampling_params"] == {"temperature": 0, "max_new_tokens": 8}


def test_sampled_prompts_are_parsed_and_sent():
    prompts = smoke.load_prompts()
    sampled = [p for p in prompts if p.seeded]
    assert sampled and all(dict(p.sampling)["sampling_seed"] >= 0 for p in sampled)
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"text": "x", "output_ids": [5], "meta_info": {}})

    with _client(handler) as client:
        smoke.generate(client, "http://h:1", sampled[0], {}, [1])
    params = bodies[0]["sampling_params"]
    assert params["temperature"] == dict(sampled[0].sampling)["temperature"] > 0 and "sampling_seed" in params


def test_seeded_prompts_run_only_where_both_servers_draw_with_seeds():
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path.endswith("tokenize"):
            return httpx.Response(404)
        asked.append(json.loads(request.content)["sampling_params"].get("temperature"))
        return httpx.Response(200, json={"text": "x", "output_ids": [5], "meta_info": {}})

    prompts = [smoke.Prompt("g", "hi", 4), smoke.Prompt("s", "hi", 4, (("temperature", 1.0), ("sampling_seed", 3)))]
    with _client(handler) as client:
        greedy_only = smoke.run_equivalence(client, ("a", "http://a:1", {}), ("b", "http://b:1", {}), prompts)
        both = smoke.run_equivalence(client, ("a", "http://a:1", {}), ("b", "http://b:1", {}), prompts, seeded=True)
    assert [r.id for r in greedy_only.prompts] == ["g"] and [r.id for r in both.prompts] == ["g", "s"]
    assert asked.count(1.0) == 2  # the sampled prompt on both servers, once
    assert smoke.seeded_sampling("reference", ())
    assert not smoke.seeded_sampling("sglang", ("--sampling-backend", "pytorch"))
    assert smoke.seeded_sampling("sglang", ("--enable-deterministic-inference",))


def _kinds() -> list[smoke.Prompt]:
    return [
        smoke.Prompt("plain", "hi", 8),
        smoke.Prompt("plain_topk", "hi", 8, (("top_k", 5), ("temperature", 0.0))),
        smoke.Prompt("freq", "hi", 8, (("frequency_penalty", 1.2),)),
        smoke.Prompt("rep", "hi", 8, (("repetition_penalty", 1.1),)),
        smoke.Prompt("min_new", "hi", 16, (("min_new_tokens", 12),)),
        smoke.Prompt("seeded", "hi", 8, (("temperature", 0.7), ("sampling_seed", 3))),
    ]


@pytest.mark.parametrize("mode", ["linear", "shadow"])
def test_sglang_dflash_modes_compare_only_greedy_plain_prompts_and_say_why(mode: str) -> None:
    for seeded in (False, True):  # deterministic inference on both sides changes nothing for DFLASH
        plan = smoke.comparable(_kinds(), "sglang", mode, seeded)
        assert [p.id for p in plan.prompts] == ["plain", "plain_topk"]
        (gone,) = plan.left_out
        assert gone.ids == ("freq", "rep", "min_new", "seeded")
        assert f"DFLASH ({mode})" in gone.why and "penalties" in gone.why and "min_new_tokens" in gone.why


@pytest.mark.parametrize(("engine", "mode"), [("sglang", "tree"), ("reference", "linear"), ("reference", "shadow")])
def test_tree_and_the_reference_engine_compare_every_kind(engine: str, mode: str) -> None:
    every = [p.id for p in _kinds()]
    assert [p.id for p in smoke.comparable(_kinds(), engine, mode, True).prompts] == every
    plan = smoke.comparable(_kinds(), engine, mode, False)  # seeds not drawn alike: only the seeded prompt goes
    assert [p.id for p in plan.prompts] == [i for i in every if i != "seeded"]
    assert [(g.ids, g.why) for g in plan.left_out] == [(("seeded",), smoke.UNSEEDED_WHY)]


def test_the_shipped_prompts_have_greedy_plain_ones_for_dflash_services() -> None:
    plan = smoke.comparable(smoke.load_prompts(), "sglang", "linear", True)
    assert plan.prompts and all(p.plain for p in plan.prompts)
    assert sum(len(g.ids) for g in plan.left_out) == sum(not p.plain for p in smoke.load_prompts())


def test_equivalence_cli_compares_each_service_on_what_its_mode_promises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`smoke --equivalence`: an SGLang linear service gets the greedy plain prompts, an SGLang tree service every
    kind; each run prints what it left out and why, and --json carries it."""
    import json

    from opsctl.cli.smoke import _equivalence
    from opsctl.inventory.load import load_inventory

    model = "model: {source: /data/m, source_on: host, path: /dev/shm/m, hybrid: false}"
    draft = "draft_model: {source: /data/d, source_on: host, path: /dev/shm/d}"
    deterministic = "extra_args: ['--enable-deterministic-inference']"
    services = {
        "base": f"gpus: [0], port: 30000, mode: baseline, {model}, {deterministic}",
        "lin": f"gpus: [1], port: 30001, mode: linear, {model}, {draft}, {deterministic}",
        "tree": f"gpus: [2], port: 30002, mode: tree, {model}, {draft}, {deterministic}",
    }
    listed = "\n".join(f"      {name}: {{{body}}}" for name, body in services.items())
    inv_file = tmp_path / "inv.yaml"
    inv_file.write_text(f"hosts:\n  h1:\n    address: 10.0.0.1\n    gpus: 4\n    services:\n{listed}\n")
    inv = load_inventory(inv_file)
    prompts = tmp_path / "p.yaml"
    prompts.write_text(
        yaml.safe_dump(
            {
                "prompts": [
                    {"id": "plain", "prompt": "hi", "max_tokens": 4},
                    {"id": "freq", "prompt": "hi", "max_tokens": 4, "sampling": {"frequency_penalty": 1.2}},
                    {"id": "min_new", "prompt": "hi", "max_tokens": 16, "sampling": {"min_new_tokens": 12}},
                    {"id": "seeded", "prompt": "hi", "sampling": {"temperature": 0.7, "sampling_seed": 3}},
                ]
            }
        )
    )
    asked: dict[str, list[Any]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if request.url.path.endswith("tokenize"):
            return httpx.Response(404)
        asked.setdefault(str(request.url.port), []).append(json.loads(request.content)["sampling_params"])
        return httpx.Response(200, json={"text": "x", "output_ids": [5], "meta_info": {}})

    host = inv.hosts[0]
    selection = [(host, s) for s in host.services]
    with _client(handler) as client:
        ok = _equivalence(client, inv, selection, "h1/base", prompts, 1.0, True)
    captured = capsys.readouterr()
    out, said = captured.out, " ".join((captured.out + captured.err).split())  # rich wraps long lines
    assert ok
    assert len(asked["30001"]) == 1 and len(asked["30002"]) == 4  # linear: only the plain prompt; tree: all four
    assert "h1/lin vs h1/base (sglang linear): 1 prompts, greedy" in said
    assert "3 left out (freq, min_new, seeded): sampled, penalized and min_new_tokens prompts: SGLang's DFLASH" in said
    assert "h1/tree vs h1/base (sglang tree): 4 prompts" in said
    reports = json.loads(out[out.index("[\n") :])
    by_service = {r["service"]: r for r in reports}
    assert [g["ids"] for g in by_service["h1/lin"]["left_out"]] == [["freq", "min_new", "seeded"]]
    assert by_service["h1/tree"]["left_out"] == [] and len(by_service["h1/tree"]["prompts"]) == 4
