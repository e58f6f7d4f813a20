"""Tokens to text, incrementally: stop strings, the tokens they cost, and what is safe to stream yet.

Pure: the tokenizer enters only as a ``decode`` callable, so unit tests use a toy one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Decode = Callable[[Sequence[int]], str]
_REPLACEMENT = "\ufffd"  # a token that ends mid UTF-8 character decodes to this until the rest arrives


@dataclass(frozen=True)
class StopHit:
    text: str  # the stop string that matched
    index: int  # where it starts in the full text
    tokens: int  # the fewest tokens whose text contains it


class TextAssembler:
    """Accumulates committed tokens; ``add`` returns the text delta that is safe to emit now.

    Held back: a trailing partial UTF-8 character and any suffix that could be the start of a stop string.
    Once a stop string appears, ``stop`` is set, the text ends before it (after it with ``keep_stop``, SGLang's
    ``no_stop_trim``) and later tokens are ignored.
    """

    def __init__(self, decode: Decode, stop: Sequence[str] = (), keep_stop: bool = False) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._keep_stop = keep_stop
        self.tokens: list[int] = []
        self.text = ""  # full text so far (trimmed at the stop string once it matched)
        self._emitted = 0
        self.stop: StopHit | None = None

    def add(self, new_tokens: Sequence[int]) -> str:
        if self.stop is not None or not new_tokens:
            return ""
        before = len(self.tokens)
        self.tokens.extend(new_tokens)
        self.text = self._decode(self.tokens)
        hit = _find_stop(self.text, self._stop, start=max(0, self._emitted - _longest(self._stop)))
        if hit is not None:
            self.stop = StopHit(hit[1], hit[0], self._tokens_for(hit[1], hit[0], before))
            self.tokens = self.tokens[: self.stop.tokens]
            self.text = self.text[: hit[0] + (len(hit[1]) if self._keep_stop else 0)]
            return self._emit(len(self.text))
        return self._emit(self._safe_end())

    def finish(self) -> str:
        """Everything not yet emitted (call once generation ended)."""
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    def _safe_end(self) -> int:
        end = len(self.text)
        while end > self._emitted and self.text[end - 1] == _REPLACEMENT:
            end -= 1
        hold = max((_partial_suffix(self.text[:end], s) for s in self._stop), default=0)
        return max(self._emitted, end - hold)

    def _tokens_for(self, stop: str, index: int, before: int) -> int:
        """Fewest tokens whose decoded text already contains the stop string (it appeared in this batch)."""
        for k in range(max(before, 1), len(self.tokens) + 1):
            if stop in self._decode(self.tokens[:k])[index:]:
                return k
        return len(self.tokens)


def _find_stop(text: str, stops: Sequence[str], start: int) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


def _longest(stops: Sequence[str]) -> int:
    return max((len(s) for s in stops), default=0)


def _partial_suffix(text: str, stop: str) -> int:
    """Length of the longest proper prefix of ``stop`` that ``text`` ends with."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
