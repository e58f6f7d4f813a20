"""HTTP surface: SGLang's endpoints on FastAPI. Handlers validate, queue through the worker, and format."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ddtree.acceptance import Decoding, RequestRules, SamplerRules
from ddtree.serve import sse
from ddtree.serve.auth import ApiKeyMiddleware
from ddtree.serve.chat import render_chat
from ddtree.serve.disconnect import ClientGone, unless_disconnected
from ddtree.serve.inflight import Inflight, InflightMiddleware
from ddtree.serve.limits import read_body
from ddtree.serve.protocol import (
    DEFAULT_MODEL_NAME,
    ChatRequest,
    CompletionRequest,
    GenerateRequest,
    RequestError,
    Sampling,
    lone_surrogate,
    parse_chat,
    parse_completion,
    parse_generate,
    parse_tokenize,
    refuse_lora,
    resolve_max_tokens,
    token_ids,
)
from ddtree.serve.reasoning import StreamingSplitter, forced_reasoning, split_reasoning
from ddtree.serve.request_id import REQUEST_ID_HEADER, RequestIdMiddleware, request_id
from ddtree.serve.service import EngineError, Outcome, run, run_all
from ddtree.serve.state import AppState, Loaded, Phase
from ddtree.serve.worker import GenParams

log = logging.getLogger("ddtree.serve")
T = TypeVar("T")


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """SGLang's ErrorResponse shape."""
    kind = {
        400: "BadRequestError",
        404: "NotFoundError",
        413: "PayloadTooLargeError",
        500: "InternalServerError",
        503: "ServiceUnavailable",
    }
    return JSONResponse(
        {"object": "error", "message": message, "type": kind.get(status, "Error"), "param": param, "code": status},
        status_code=status,
    )


class _NotReady(Exception):
    pass


def create_app(state: AppState) -> FastAPI:
    app = FastAPI(title="ddtree reference server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    args = state.args

    if args.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, key=args.api_key)
    inflight = Inflight()
    app.add_middleware(InflightMiddleware, inflight=inflight)
    app.add_middleware(RequestIdMiddleware)  # added last: outermost, so a 401 carries the id too

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        """A bug must still answer in SGLang's shape (Starlette's default is a plain-text 500)."""
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        response = error_response(500, f"Internal server error: {type(exc).__name__}")
        response.headers[REQUEST_ID_HEADER] = request_id(request.scope)  # outside the middleware: set here
        return response

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError) -> Response:
        if exc.shape == "native" and exc.stream:  # SGLang's streamed /generate: the error is the stream's one event
            return _sse(_generate_refusal(exc))
        if exc.shape == "native":  # SGLang's /generate after its contract check (http_server._create_error_response)
            return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status)
        if exc.shape == "contract":  # SGLang's /generate JSON contract (api_contract.generate_contract_error)
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(_NotReady)
    async def _not_ready(_: Request, exc: _NotReady) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, exc: ClientGone) -> Response:
        """Nobody reads this (the client left); 499 is nginx's "client closed request", for the access log."""
        return Response(status_code=499)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return error_response(500, f"generation failed: {exc}")

    def _model_card(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": int(state.started_wall),
            "owned_by": "sglang",
            "root": args.model_path,
            "max_model_len": state.info.context_len,
        }

    def ready() -> Loaded:
        if state.phase is not Phase.READY or state.loaded is None:
            raise _NotReady(f"the server is not ready (phase: {state.phase.value})")
        return state.loaded

    # JSON parsing, chat templates and tokenization run here, one at a time: off the event loop (so /health
    # answers while a large prompt is tokenized), and never two encodes at once on the one HF tokenizer.
    tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    async def off_loop(fn: Callable[..., T], *fn_args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(tokenize_pool, functools.partial(fn, *fn_args))

    async def body_of(request: Request) -> bytes:
        return await read_body(request, state.info.context_len)

    # -- health ----------------------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        ok = state.phase is Phase.READY and state.loaded is not None and state.loaded.worker.alive()
        return Response(status_code=200 if ok else 503)

    @app.get("/ready")
    async def ready_endpoint() -> Response:
        ok = state.phase is Phase.READY
        return JSONResponse({"status": state.phase.value}, status_code=200 if ok else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        """SGLang's deep health check: one real token through the queue."""
        try:
            loaded = ready()
            ids = list(loaded.tokenizer.encode("hi", add_special_tokens=False)) or [0]
            await run_all(loaded.worker, _decoder(loaded), GenParams(tuple(ids), 1, 0.0, None, ()), ())
        except (_NotReady, EngineError):
            return Response(status_code=503)
        return Response(status_code=200)

    # -- info ------------------------------------------------------------------------------------------------
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(args.served_model_name)]}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Response:
        """OpenAI's models.retrieve: the served name only, SGLang's 404 body otherwise."""
        if model != args.served_model_name:
            error = {
                "message": f"The model '{model}' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
            return JSONResponse({"error": error}, status_code=404)
        return JSONResponse(_model_card(model))

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return state.server_info()

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        """SGLang's shape; sglang-router reads it when a worker is added."""
        return {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "served_model_name": args.served_model_name,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    @app.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        """SGLang's shape (one entry per data-parallel rank): running and queued generation requests. Counted
        at the HTTP edge, so a request between arrival and its last response byte is never missed (drain)."""
        loaded = state.loaded
        queued = loaded.worker.queued if loaded is not None else 0
        running = max(inflight.count - queued, 0)
        return [{"dp_rank": 0, "num_reqs": running, "num_waiting_reqs": queued, "num_tokens": 0}]

    @app.get("/metrics")
    async def metrics() -> Response:
        loaded = state.loaded
        if loaded is not None:
            state.stats.set_queue(loaded.worker.queued)
        return Response(generate_latest(state.stats.registry), media_type=CONTENT_TYPE_LATEST)

    # -- generation ------------------------------------------------------------------------------------------
    def prepare_chat(raw: bytes) -> tuple[ChatRequest, Loaded, GenParams]:
        req = parse_chat(_json(raw))
        refuse_lora(req.model, req.lora_path, args.served_model_name)
        loaded = ready()
        prompt = render_chat(loaded.tokenizer, req.messages, req.chat_template_kwargs, req.continue_final_message)
        return req, loaded, _params(state, loaded, prompt, req.sampling)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req, loaded, params = await off_loop(prepare_chat, await body_of(request))
        split = args.reasoning_parser is not None and req.separate_reasoning
        force = split and forced_reasoning(args.reasoning_parser, dict(req.chat_template_kwargs))
        rid, created = uuid.uuid4().hex, int(time.time())
        head = {"id": rid, "created": created, "model": _echo(req.model)}
        stop, keep = req.sampling.stop, req.sampling.no_stop_trim
        if req.stream:
            return _sse(_chat_stream(loaded, params, stop, keep, head, split, force, req.include_usage))
        out = await _complete(request, loaded, params, stop, keep)
        reasoning, content = (split_reasoning(out.text, force) if split else None), out.text
        if reasoning is not None:
            content = reasoning.content
        message = {
            "role": "assistant",
            "content": content or None,
            "reasoning_content": (reasoning.reasoning or None) if reasoning else None,
            "tool_calls": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _openai_reason(out),
            "matched_stop": out.matched_stop,
        }
        return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": out.usage})

    def prepare_completion(raw: bytes) -> tuple[CompletionRequest, Loaded, GenParams]:
        req = parse_completion(_json(raw))
        refuse_lora(req.model, req.lora_path, args.served_model_name)
        loaded = ready()
        if isinstance(req.prompt, str):
            prompt = list(loaded.tokenizer.encode(req.prompt, add_special_tokens=False))
        else:
            prompt = _check_vocab(list(req.prompt), loaded, "prompt")
        if not prompt:
            raise RequestError("prompt must not be empty", "prompt")
        return req, loaded, _params(state, loaded, prompt, req.sampling)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req, loaded, params = await off_loop(prepare_completion, await body_of(request))
        rid, created = uuid.uuid4().hex, int(time.time())
        head = {"id": rid, "created": created, "model": _echo(req.model)}
        stop, keep = req.sampling.stop, req.sampling.no_stop_trim
        if req.stream:
            return _sse(_completion_stream(loaded, params, stop, keep, head, req.include_usage))
        out = await _complete(request, loaded, params, stop, keep)
        choice = {
            "index": 0,
            "text": out.text,
            "logprobs": None,
            "finish_reason": _openai_reason(out),
            "matched_stop": out.matched_stop,
        }
        return JSONResponse({**head, "object": "text_completion", "choices": [choice], "usage": out.usage})

    def prepare_generate(raw: bytes) -> tuple[GenerateRequest, Loaded, GenParams]:
        req = parse_generate(_json(raw))
        refuse_lora(None, req.lora_path, args.served_model_name)
        loaded = ready()
        try:  # SGLang's tokenizer manager refuses these with a ValueError: /generate's native error shape
            if req.input_ids is not None:
                prompt = _check_vocab(list(req.input_ids), loaded, "input_ids")
            else:
                prompt = list(loaded.tokenizer.encode(req.text or "", add_special_tokens=False))
                if not prompt:
                    raise RequestError("text must not be empty", "text")
            return req, loaded, _params(state, loaded, prompt, req.sampling)
        except RequestError as exc:
            raise exc.native(req.stream) from None

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        req, loaded, params = await off_loop(prepare_generate, await body_of(request))
        rid, t0 = uuid.uuid4().hex, time.perf_counter()
        stop, keep = req.sampling.stop, req.sampling.no_stop_trim
        if req.stream:
            return _sse(_generate_stream(loaded, params, stop, keep, rid, t0))
        out = await _complete(request, loaded, params, stop, keep)
        return JSONResponse(_generate_body(out, rid, t0))

    def tokenize_ids(raw: bytes) -> list[int]:
        req = parse_tokenize(_json(raw))
        loaded = ready()
        if req.messages is not None:
            return render_chat(loaded.tokenizer, req.messages, req.chat_template_kwargs)
        return list(loaded.tokenizer.encode(req.prompt or "", add_special_tokens=req.add_special_tokens))

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> Response:
        ids = await off_loop(tokenize_ids, await body_of(request))
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.info.context_len})

    def detokenize_text(raw: bytes) -> str:
        body = _json(raw)
        if not isinstance(body, dict) or "tokens" not in body:
            raise RequestError("tokens (a list of token ids) is required", "tokens")
        loaded = ready()
        ids = _check_vocab(list(token_ids(body["tokens"], "tokens")), loaded, "tokens")
        return _decoder(loaded)(ids)

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> Response:
        return JSONResponse({"text": await off_loop(detokenize_text, await body_of(request))})

    return app


# -- helpers --------------------------------------------------------------------------------------------------
def _json(raw: bytes) -> Any:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"Malformed JSON in request body: {exc}") from None
    except RecursionError:
        raise RequestError("Malformed JSON in request body: nested too deeply") from None
    surrogate = lone_surrogate(body)
    if surrogate is not None:  # SGLang's orjson refuses the body; Python's json would hand it to the tokenizer
        raise RequestError(
            f"Malformed JSON in request body: JSON decode error: {surrogate} "
            "(a lone UTF-16 surrogate such as \\udfff is not text: send valid Unicode)"
        )
    return body


def _echo(model: str | None) -> str:
    """SGLang answers with the request's own model name (its protocol default when the request has none)."""
    return DEFAULT_MODEL_NAME if model is None else model


async def _complete(request: Request, loaded: Loaded, params: GenParams, stop: tuple[str, ...], keep: bool) -> Outcome:
    """A non-stream generation, cancelled (``ClientGone``) if its client disconnects first."""
    return await unless_disconnected(request.receive, run_all(loaded.worker, _decoder(loaded), params, stop, keep))


def _decoder(loaded: Loaded) -> Callable[[Any], str]:
    tok = loaded.tokenizer

    def decode(ids: Any) -> str:
        return str(tok.decode(list(ids), skip_special_tokens=True))

    return decode


def _check_vocab(ids: list[int], loaded: Loaded, param: str) -> list[int]:
    n = len(loaded.tokenizer)
    bad = [t for t in ids if t >= n]
    if bad:
        raise RequestError(f"{param}: token id {bad[0]} is outside the vocabulary (size {n})", param)
    return ids


def _params(state: AppState, loaded: Loaded, prompt: list[int], s: Sampling) -> GenParams:
    max_new = resolve_max_tokens(s.max_tokens, len(prompt), state.info.context_len)
    stops = tuple(dict.fromkeys((() if s.ignore_eos else loaded.stop_token_ids) + s.stop_token_ids))
    seed = s.seed if s.seed is not None else state.args.random_seed
    return GenParams(tuple(prompt), max_new, s.temperature, seed, stops, _decoding(loaded, s))


def _decoding(loaded: Loaded, s: Sampling) -> Decoding | None:
    """The request's sampler settings and logit rules (None: temperature only). min_tokens holds back the
    model's stop tokens and the request's own, as SGLang's min-new-tokens penalizer does (ignore_eos or not)."""
    sampler = SamplerRules(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p)
    _check_vocab([token for token, _ in s.logit_bias], loaded, "logit_bias")
    rules = RequestRules(
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty,
        min_new_tokens=s.min_tokens,
        stop_token_ids=frozenset(loaded.stop_token_ids + s.stop_token_ids),
        logit_bias=dict(s.logit_bias),
    )
    decoding = Decoding(sampler=sampler, rules=rules)
    return None if decoding.temperature_only else decoding


def _openai_reason(out: Outcome) -> str:
    return "length" if out.finish_reason == "length" else "stop"


def _sse(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _chat_stream(
    loaded: Loaded,
    params: GenParams,
    stop: tuple[str, ...],
    keep: bool,
    head: dict[str, Any],
    split: bool,
    force: bool,
    include_usage: bool,
) -> AsyncIterator[str]:
    base = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, matched: Any = None) -> str:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["matched_stop"] = matched
        return sse.event({**base, "choices": [choice]})

    splitter = StreamingSplitter(force) if split else None

    def deltas(text: str, final: bool = False) -> list[str]:
        if splitter is None:
            return [chunk({"content": text})] if text else []
        part = splitter.flush() if final else splitter.feed(text)
        out = []
        if part.reasoning:
            out.append(chunk({"reasoning_content": part.reasoning}))
        if part.content:
            out.append(chunk({"content": part.content}))
        return out

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for item in run(loaded.worker, _decoder(loaded), params, stop, keep):
            if isinstance(item, str):
                for c in deltas(item):
                    yield c
                continue
            for c in deltas("", final=True):
                yield c
            yield chunk({}, _openai_reason(item), item.matched_stop)
            if include_usage:
                yield sse.event({**base, "choices": [], "usage": item.usage})
    except EngineError as exc:
        yield sse.event({"error": {"message": f"generation failed: {exc}", "type": "InternalServerError", "code": 500}})
    yield sse.DONE


async def _completion_stream(
    loaded: Loaded, params: GenParams, stop: tuple[str, ...], keep: bool, head: dict[str, Any], include_usage: bool
) -> AsyncIterator[str]:
    base = {**head, "object": "text_completion"}
    try:
        async for item in run(loaded.worker, _decoder(loaded), params, stop, keep):
            if isinstance(item, str):
                choice = {"index": 0, "text": item, "logprobs": None, "finish_reason": None}
                yield sse.event({**base, "choices": [choice]})
                continue
            choice = {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": _openai_reason(item),
                "matched_stop": item.matched_stop,
            }
            yield sse.event({**base, "choices": [choice]})
            if include_usage:
                yield sse.event({**base, "choices": [], "usage": item.usage})
    except EngineError as exc:
        yield sse.event({"error": {"message": f"generation failed: {exc}", "type": "InternalServerError", "code": 500}})
    yield sse.DONE


def _generate_body(out: Outcome, rid: str, t0: float, partial_text: str | None = None) -> dict[str, Any]:
    if out.finish_reason == "length":
        finish: dict[str, Any] | None = {"type": "length", "length": len(out.tokens)}
    elif out.finish_reason == "abort":
        finish = {"type": "abort", "message": "aborted"}
    else:
        finish = {"type": "stop", "matched": out.matched_stop}
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.tokens),
        "cached_tokens": 0,
        "e2e_latency": time.perf_counter() - t0,
        "spec_verify_ct": out.rounds,
        "spec_accept_lengths": list(out.accept_lengths),
    }
    return {"text": out.text, "output_ids": list(out.tokens), "meta_info": meta}


async def _generate_refusal(exc: RequestError) -> AsyncIterator[str]:
    """SGLang's streamed /generate refusal (http_server.generate_request's stream_results): HTTP 200, one error
    event, then [DONE]."""
    error = {"message": exc.message, "type": "invalid_request_error", "code": exc.status, "retryable": False}
    yield sse.event({"error": error})
    yield sse.DONE


async def _generate_stream(
    loaded: Loaded, params: GenParams, stop: tuple[str, ...], keep: bool, rid: str, t0: float
) -> AsyncIterator[str]:
    """SGLang streams /generate as cumulative ``text`` with ``finish_reason: null`` until the last chunk."""
    text = ""
    try:
        async for item in run(loaded.worker, _decoder(loaded), params, stop, keep):
            if isinstance(item, str):
                text += item
                meta = {"id": rid, "finish_reason": None, "prompt_tokens": len(params.prompt_ids)}
                yield sse.event({"text": text, "meta_info": meta})
                continue
            yield sse.event(_generate_body(item, rid, t0))
    except EngineError as exc:
        yield sse.event({"error": {"message": f"generation failed: {exc}", "code": 500}})
    yield sse.DONE
