"""One generation from the HTTP side: submit to the worker, assemble text, apply stop strings, finish."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ddtree.serve.textout import Decode, TextAssembler
from ddtree.serve.worker import Done, EngineWorker, Failed, GenParams, Tokens


class EngineError(RuntimeError):
    """The engine raised while generating (a 500, never a crash of the server)."""


@dataclass(frozen=True)
class Outcome:
    prompt_tokens: int
    tokens: tuple[int, ...]  # completion tokens (cut after the one that completed a stop string)
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: str | int | None  # the stop string, or the stop token id, as SGLang's matched_stop
    rounds: int
    accept_lengths: tuple[int, ...]

    @property
    def usage(self) -> dict[str, int]:
        n = len(self.tokens)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}


async def run(
    worker: EngineWorker, decode: Decode, params: GenParams, stop: Sequence[str], keep_stop: bool = False
) -> AsyncIterator[str | Outcome]:
    """Yields text deltas as they become safe to show, then exactly one ``Outcome``. ``keep_stop``: the text
    keeps the stop string it matched (SGLang's ``no_stop_trim``)."""
    text = TextAssembler(decode, stop, keep_stop)
    job = worker.submit(params)
    done: Done | None = None
    seen: list[int] = []  # tokens per round, in case we stop before the worker reports Done
    async for ev in job.results():
        if isinstance(ev, Failed):
            raise EngineError(ev.message)
        if isinstance(ev, Done):
            done = ev
            break
        assert isinstance(ev, Tokens)
        seen.append(len(ev.ids))
        delta = text.add(ev.ids)
        if delta:
            yield delta
        if text.stop is not None:
            break  # leaving results() cancels the rest of this request in the worker
    tail = text.finish()
    if tail:
        yield tail
    toks = tuple(text.tokens)
    matched: str | int | None
    if text.stop is not None:
        reason, matched = "stop", text.stop.text
    elif done is None:
        reason, matched = "abort", None
    elif done.finish_reason == "stop" and toks and toks[-1] in params.stop_token_ids:
        reason, matched = "stop", toks[-1]
    else:
        reason, matched = done.finish_reason, None
    yield Outcome(
        prompt_tokens=len(params.prompt_ids),
        tokens=toks,
        text=text.text,
        finish_reason=reason,
        matched_stop=matched,
        rounds=done.rounds if done else len(seen),
        accept_lengths=done.accept_lengths if done else tuple(seen),
    )


async def run_all(
    worker: EngineWorker, decode: Decode, params: GenParams, stop: Sequence[str], keep_stop: bool = False
) -> Outcome:
    async for item in run(worker, decode, params, stop, keep_stop):
        if isinstance(item, Outcome):
            return item
    raise EngineError("generation ended without a result")
