"""The real ddtree.serve process on the tiny models, over HTTP: modes agree, queueing, errors, auth, metrics,
logs. One server per (arch, mode) for the whole run (`reference_servers`, tests/runtime/serve_process.py; the
dense baseline is test_serve_openai's too), started the way opsctl starts it: ``--config server.yaml`` (holding
the API key) and the DDTREE_* environment."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from ddtree.serve import sse
from prometheus_client.parser import text_string_to_metric_families
from serve_process import API_KEY, ServeProcess, ServerPool, free_port

from opsctl.metrics import DDTreeInit, DDTreeMetrics, DDTreeVerify, DecodeBatch, Malformed, parse_lines

pytestmark = pytest.mark.runtime

ARCHES = ("dense", "hybrid")
MODES = ("baseline", "linear", "shadow", "tree")


def chat_body(q: str, max_tokens: int, enable_thinking: bool | None = None, ignore_eos: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": q}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if enable_thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def _generate(s: ServeProcess, ids: list[int], n: int) -> dict[str, Any]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0}}
    r = s.post("/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("arch", ARCHES)
def test_greedy_identical_across_modes(reference_servers: ServerPool, arch: str) -> None:
    ref = reference_servers(arch, "baseline", *MODES[1:])
    prompts = [ref.chat_ids("What is 2+2?", thinking=False), ref.chat_ids("Name a color.", thinking=True)]
    chat = chat_body("What is 2+2?", max_tokens=24, enable_thinking=False)
    results: dict[str, tuple[Any, ...]] = {}
    for mode in MODES:
        s = reference_servers(arch, mode)
        outs = [_generate(s, ids, 24) for ids in prompts]
        r = s.post("/v1/chat/completions", chat)
        assert r.status_code == 200, r.text
        c = r.json()
        results[mode] = (
            [o["output_ids"] for o in outs],
            [o["text"] for o in outs],
            c["choices"][0]["message"]["content"],
            c["usage"],
        )
        for o in outs:  # usage adds up and rounds never exceed tokens (speculation commits >= 1 per round)
            meta = o["meta_info"]
            assert meta["completion_tokens"] == len(o["output_ids"]) and 1 <= len(o["output_ids"]) <= 24
            assert sum(meta["spec_accept_lengths"]) >= meta["completion_tokens"] - 1
    assert results["baseline"][0][0], "baseline produced no tokens"
    for mode in MODES[1:]:
        assert results[mode] == results["baseline"], f"{arch}: {mode} differs from baseline"


def test_sixteen_concurrent_requests(reference_servers: ServerPool) -> None:
    s = reference_servers("dense", "tree")
    questions = ["What is 2+2?", "Name a color.", "Say hi.", "Count to three."]
    bodies = [chat_body(questions[i % 4], max_tokens=6, enable_thinking=False, ignore_eos=True) for i in range(16)]
    with cf.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda b: s.post("/v1/chat/completions", b, timeout=300), bodies))
    assert [r.status_code for r in replies] == [200] * 16
    by_question: dict[str, set[str]] = {}
    for body, r in zip(bodies, replies, strict=True):
        data = r.json()
        q = body["messages"][0]["content"]
        assert data["usage"] == {
            "prompt_tokens": len(s.chat_ids(q, thinking=False)),
            "completion_tokens": 6,
            "total_tokens": len(s.chat_ids(q, thinking=False)) + 6,
        }
        assert data["choices"][0]["finish_reason"] == "length"
        by_question.setdefault(q, set()).add(json.dumps(data["choices"][0]["message"]))
    # greedy: the same question gets the same answer however the requests interleaved in the queue
    assert all(len(answers) == 1 for answers in by_question.values()), by_question


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"messages": [', "Malformed JSON"),
        (chat_body("hi", max_tokens=-1), "max_tokens must be >= 0"),
        (chat_body("hi", max_tokens=10**9), "maximum context length"),
        ({**chat_body("hi", max_tokens=4), "logprobs": True}, "logprobs is not supported"),
    ],
)
def test_bad_requests_get_400(reference_servers: ServerPool, body: Any, fragment: str) -> None:
    s = reference_servers("dense", "baseline")
    r = s.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["message"] and r.json()["code"] == 400


def test_api_key(reference_servers: ServerPool) -> None:
    s = reference_servers("dense", "baseline")
    body = chat_body("hi", max_tokens=2)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    assert httpx.get(f"{s.url}/v1/models", timeout=10).status_code == 401
    for path in ("/health", "/ready", "/metrics"):  # exempt, as in SGLang
        assert httpx.get(f"{s.url}{path}", timeout=10).status_code == 200
    models = s.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


# What sglang-router 0.3.2 sends a worker, recorded from the real binary: its /v1/chat/completions and
# /generate bodies (it renames max_tokens to max_completion_tokens and adds its own defaults).
ROUTER_CHAT = {
    "messages": [{"role": "user", "content": "What is 2+2?"}], "model": "tiny", "logprobs": False,
    "max_completion_tokens": 4, "stream": False, "temperature": 0.0, "no_stop_trim": False, "ignore_eos": False,
    "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
    "stream_reasoning": True, "chat_template_kwargs": {"enable_thinking": False}, "return_hidden_states": False,
}  # fmt: skip
ROUTER_GENERATE = {
    "model": None, "input_ids": [1, 2], "sampling_params": {"temperature": 0.0, "max_new_tokens": 4},
    "return_text_in_logprobs": False, "stream": False, "log_metrics": True, "return_hidden_states": False,
    "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False,
}  # fmt: skip


def test_what_the_router_calls(reference_servers: ServerPool) -> None:
    """/health, /server_info, /model_info when the router adds a worker; its request bodies; /get_load counts
    a request from arrival to its last byte (opsctl drains on it before a deploy)."""
    s = reference_servers("dense", "baseline")
    info = s.get("/model_info").json()
    assert info["model_path"] == s.get("/server_info").json()["model_path"] and info["is_generation"] is True
    r = s.post("/v1/chat/completions", ROUTER_CHAT)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4, r.text
    r = s.post("/generate", ROUTER_GENERATE)
    assert r.status_code == 200 and 1 <= len(r.json()["output_ids"]) <= 4, r.text
    assert s.get("/get_load").json() == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    long = chat_body("Count to three.", max_tokens=400, ignore_eos=True)
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(s.post, "/v1/chat/completions", long, 300) for _ in range(2)]
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 2 and time.monotonic() < deadline and not all(f.done() for f in futures):
            load = s.get("/get_load").json()[0]
            seen = max(seen, load["num_reqs"] + load["num_waiting_reqs"])
            time.sleep(0.05)
        assert [f.result().status_code for f in futures] == [200, 200]
    assert seen == 2, "both requests should have been in flight at once"
    assert s.get("/get_load").json()[0]["num_reqs"] == 0


def test_tokenize_matches_the_chat_template(reference_servers: ServerPool) -> None:
    s = reference_servers("dense", "baseline")
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    tok = s.post("/tokenize", body).json()  # what opsctl smoke --equivalence asks for
    assert tok["tokens"] == s.chat_ids("What is 2+2?", thinking=False) and tok["count"] == len(tok["tokens"])
    plain = s.post("/v1/tokenize", {"prompt": "hi there"}).json()["tokens"]
    assert s.post("/detokenize", {"tokens": plain}).json() == {"text": "hi there"}
    assert s.post("/tokenize", {"prompt": "x", "messages": []}).status_code == 400


def test_chat_reasoning_stream_stop_and_seed(reference_servers: ServerPool) -> None:
    s = reference_servers("dense", "linear")
    # thinking on (the default): the reply starts inside <think>, so the text lands in reasoning_content
    full = s.post("/v1/chat/completions", chat_body("What is 2+2?", max_tokens=12)).json()
    msg = full["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["tool_calls"] is None
    stream = s.post("/v1/chat/completions", {**chat_body("What is 2+2?", max_tokens=12), "stream": True})
    events = s.sse(stream)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:-1] if isinstance(e, dict) and e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == (msg["content"] or "")
    assert events[-2]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    # stop strings: cut where the greedy text first shows the stop string
    prompt = s.tokenizer.decode(s.chat_ids("Count to three.", thinking=False))
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    plain = s.post("/v1/completions", body).json()
    text = plain["choices"][0]["text"]
    assert len(text) >= 6 and plain["usage"]["completion_tokens"] == 24, plain
    stop = text[3:5]
    cut = s.post("/v1/completions", {**body, "stop": [stop]}).json()
    choice = cut["choices"][0]
    assert choice["text"] == text[: text.find(stop)]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
    assert cut["usage"]["completion_tokens"] < 24
    # seed: sampling at temperature 1 is reproducible
    sampled = [
        s.post("/v1/completions", {"prompt": "Once", "max_tokens": 8, "temperature": 1.0, "seed": 7}).json()
        for _ in range(2)
    ]
    assert sampled[0]["choices"][0]["text"] == sampled[1]["choices"][0]["text"]


@pytest.mark.parametrize("arch", ARCHES)
def test_metrics_and_log_lines(reference_servers: ServerPool, arch: str) -> None:
    s = reference_servers(arch, "tree")
    before = s.metric("sglang:generation_tokens")
    out = _generate(s, s.chat_ids("Count to three.", thinking=False), 24)
    text = s.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("sglang:spec_accept_length", "sglang:num_running_reqs", "sglang:gen_throughput",
                 "sglang:prompt_tokens", "sglang:generation_tokens", "sglang:num_queue_reqs"):  # fmt: skip
        assert name in families, name
    assert s.metric("sglang:generation_tokens") - before == len(out["output_ids"])
    assert s.metric("sglang:spec_accept_length") >= 1.0
    info = s.get("/server_info").json()
    assert info["mode"] == "tree" and info["hybrid"] == ("exact" if arch == "hybrid" else "none")
    assert info["api_key"] == "***" and API_KEY not in json.dumps(info)
    records = parse_lines(s.stderr().splitlines())
    assert not [r for r in records if isinstance(r, Malformed)]
    init = [r for r in records if isinstance(r, DDTreeInit)]
    assert len(init) == 1 and init[0].mode == "tree" and init[0].hybrid == info["hybrid"]
    assert len([r for r in records if isinstance(r, DDTreeVerify)]) == 1
    assert [r for r in records if isinstance(r, DDTreeMetrics)], "no DDTREE metrics line (DDTREE_LOG_INTERVAL=2)"
    decode = [r for r in records if isinstance(r, DecodeBatch)]
    assert decode and all(d.accept_len is not None and d.accept_len >= 1.0 for d in decode)
    # the ddtree_* series count the rounds the lines do (ddtree.prom): the latest line, plus at most one round
    # of a window it has not closed (DDTREE_LOG_INTERVAL=2)
    last = [r for r in records if isinstance(r, DDTreeMetrics)][-1]
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value for f in families.values() for x in f.samples}
    tiny = (("model_name", "tiny"),)
    rounds, tokens = samples[("ddtree_rounds_total", tiny)], samples[("ddtree_committed_tokens_total", tiny)]
    assert last.rounds <= rounds <= last.rounds + 1
    assert tokens == last.tokens if rounds == last.rounds else tokens > last.tokens
    assert samples[("ddtree_accept_length_count", tiny)] == rounds
    kinds = {k: v for (name, k), v in samples.items() if name == "ddtree_decode_rounds_total"}
    assert sum(kinds.values()) == rounds and samples[("ddtree_selfcheck_failed", tiny)] == 0
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] Decode batch, ", s.stderr(), re.M)


@pytest.mark.parametrize("mode", ["shadow", "tree"])
def test_decode_rounds_are_labelled_by_the_verify_that_made_their_tokens(
    reference_servers: ServerPool, mode: str
) -> None:
    """A shadow service verifies the spine (DFLASH's chain) and builds its trees only to report them: every decode
    round it counts is `dflash` with reason `shadow`, none `tree`; a tree service's are `tree`. Both count one
    decode round per request-round (batch 1), and the tree statistics (rounds, nodes) of both move."""
    s = reference_servers("dense", mode)
    _generate(s, s.chat_ids("Count to three.", thinking=False), 16)
    families = text_string_to_metric_families(s.get("/metrics").text)
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value for f in families for x in f.samples}
    kinds = {(dict(k)["kind"], dict(k)["reason"]): v for (name, k), v in samples.items()
             if name == "ddtree_decode_rounds_total" and v > 0}  # fmt: skip
    rounds = samples[("ddtree_rounds_total", (("model_name", "tiny"),))]
    nodes = samples[("ddtree_tree_nodes_sum", (("model_name", "tiny"),))]
    assert rounds > 0 and nodes >= rounds  # the trees were built and counted as request-rounds
    assert kinds == {("dflash", "shadow") if mode == "shadow" else ("tree", ""): rounds}, kinds


def test_sigterm_finishes_in_flight_request_and_exits_0(tiny_dense: Any, tmp_path: Path) -> None:
    s = ServeProcess.start(Path(tiny_dense), "baseline", tmp_path)
    try:
        s.wait_ready()
        startup = time.monotonic() - s.started
        assert 503 in s.health_seen, s.health_seen  # /health said "not yet" while the engine loaded
        body = {
            "prompt": "Once upon a time",
            "max_tokens": 200,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, headers=s.headers, timeout=120) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            s.signal_stop()  # SIGTERM while the request is in flight: its first chunk arrived
            time.sleep(0.5)
            with pytest.raises(httpx.TransportError):  # no new connections while draining
                httpx.get(f"{s.url}/health", timeout=2)
            rest = [line for line in lines if line.startswith("data: ")]
        events = sse.parse_events("\n\n".join([first, *rest]) + "\n\n")
        assert events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] == 200
        assert events[-3]["choices"][0]["finish_reason"] == "length"
        assert s.proc.wait(60) == 0
        err = s.stderr()
        assert "Received SIGTERM" in err and "Shutdown complete." in err
        print(f"startup (process start -> /health 200): {startup:.2f} s; health statuses {s.health_seen}")
    finally:
        s.stop()


def test_bad_flags_fail_at_start(tiny_dense: Any, tmp_path: Path) -> None:
    target = str(Path(tiny_dense) / "target")
    cases = [  # (argv, exit status, message): 2 = refused before serving, 1 = the engine failed to load
        ([*("--model-path", target), "--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),
        (["--model-path", str(tmp_path / "missing")], 2, "not a directory"),
        ([*("--model-path", target, "--tokenizer-path", str(tmp_path / "no-tok"))], 2, "--tokenizer-path"),
        (
            [
                *("--model-path", target, "--speculative-algorithm", "DFLASH"),
                "--speculative-draft-model-path",
                str(tmp_path),
            ],
            1,
            "Failed to load the engine",
        ),
    ]
    for argv, status, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "ddtree.serve", "--device", "cpu", "--port", str(free_port()), *argv],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == status and message in done.stderr, done.stderr[-2000:]
