"""One engine, one thread: requests queue here and run one at a time, in arrival order.

The engine is not thread-safe and holds one KV cache, so every generation goes through this worker. Results
flow back to the asyncio side through ``loop.call_soon_threadsafe``; a consumer that goes away (client
disconnect, stop string matched) sets ``cancel`` and the worker stops that request after the current round.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ddtree.serve.stats import ServerStats

if TYPE_CHECKING:
    from ddtree.acceptance import Decoding

log = logging.getLogger("ddtree.serve")

StreamFn = Callable[..., Iterator[Sequence[int]]]


@dataclass(frozen=True)
class GenParams:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float
    seed: int | None
    stop_token_ids: tuple[int, ...]
    decoding: Decoding | None = None  # top-k/p, min-p, penalties, min tokens, logit_bias (None: temperature only)


@dataclass(frozen=True)
class Tokens:
    ids: tuple[int, ...]  # committed this round (one target forward)


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop" | "length" | "abort"
    rounds: int
    accept_lengths: tuple[int, ...]


@dataclass(frozen=True)
class Failed:
    message: str


Event = Tokens | Done | Failed


@dataclass
class Job:
    params: GenParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)

    def post(self, ev: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, ev)
        except RuntimeError:  # the loop already closed (shutdown raced a cancelled request): nobody listens
            pass

    async def results(self) -> AsyncIterator[Event]:
        """Events until Done/Failed; leaving early (exception, disconnect) cancels the job."""
        try:
            while True:
                ev = await self.events.get()
                yield ev
                if not isinstance(ev, Tokens):
                    return
        finally:
            self.cancel.set()


class EngineWorker:
    def __init__(self, stream: StreamFn, stats: ServerStats) -> None:
        self._stream = stream
        self._stats = stats
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._busy = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def submit(self, params: GenParams) -> Job:
        job = Job(params=params, loop=asyncio.get_running_loop())
        self._q.put(job)
        self._stats.set_queue(self._q.qsize())
        return job

    @property
    def queued(self) -> int:
        return self._q.qsize()

    @property
    def running(self) -> int:
        return 1 if self._busy.is_set() else 0

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued job, then end the thread."""
        self._q.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            self._stats.set_queue(self._q.qsize())
            if job is None:
                return
            if job.cancel.is_set():  # the client left while queued: an abort all the same, as SGLang counts it
                self._stats.on_abort_queued(time.perf_counter() - job.submitted)
                continue
            self._busy.set()
            try:
                job.post(self._generate(job))
            except Exception as exc:  # one bad request must not kill the worker
                log.exception("generation failed")
                job.post(Failed(f"{type(exc).__name__}: {exc}"))
                self._stats.on_finish(time.perf_counter() - job.submitted, aborted=True)
            finally:
                self._busy.clear()

    def _generate(self, job: Job) -> Done:
        p = job.params
        self._stats.on_start(len(p.prompt_ids))
        produced = 0
        accept: list[int] = []
        finish = "stop" if p.max_new_tokens > 0 else "length"  # 0 tokens asked: SGLang says "length"
        it = self._stream(
            list(p.prompt_ids),
            max_new_tokens=p.max_new_tokens,
            temperature=p.temperature,
            seed=p.seed,
            stop_token_ids=p.stop_token_ids,
            **({} if p.decoding is None else {"decoding": p.decoding}),
        )
        try:
            t = time.perf_counter()
            for i, chunk in enumerate(it):
                now = time.perf_counter()
                ids = tuple(int(x) for x in chunk)[: p.max_new_tokens - produced]
                if i == 0:  # the prefill's token: not a decode round (SGLang's accept len ignores it too)
                    self._stats.on_first_token(len(ids), now - job.submitted)
                else:
                    accept.append(len(chunk))
                    self._stats.on_round(len(ids), now - t)
                produced += len(ids)
                if ids:
                    job.post(Tokens(ids))
                if ids and ids[-1] in p.stop_token_ids:  # a stop token as the last allowed token is still a stop
                    break
                if produced >= p.max_new_tokens:
                    finish = "length"
                    break
                if job.cancel.is_set():
                    finish = "abort"
                    break
                t = time.perf_counter()
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        self._stats.on_finish(time.perf_counter() - job.submitted, aborted=finish == "abort")
        return Done(finish_reason=finish, rounds=len(accept), accept_lengths=tuple(accept))
