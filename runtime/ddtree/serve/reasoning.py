"""Split a ``<think>...</think>`` block into ``reasoning_content``, as SGLang's qwen3 reasoning parser does.

With thinking enabled (Qwen3.5/3.6 templates open ``<think>`` in the prompt) everything before ``</think>`` is
reasoning, even without an opening tag; a reply cut off before ``</think>`` is all reasoning and ``content`` is
null. With ``enable_thinking: false`` only an explicit ``<think>`` starts a reasoning block.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class Split:
    reasoning: str
    content: str


def forced_reasoning(parser: str | None, chat_template_kwargs: dict[str, object] | None) -> bool:
    """Whether the reply starts inside a thinking block (qwen3: follows enable_thinking, default on)."""
    if parser == "qwen3-thinking":
        return True
    kwargs = chat_template_kwargs or {}
    return kwargs.get("enable_thinking", True) is True


def split_reasoning(text: str, force: bool) -> Split:
    """One-shot split of a whole reply."""
    prefix = ""
    if not force:
        idx = text.find(THINK_START)
        if idx < 0:
            return Split(reasoning="", content=text)
        prefix, text = text[:idx], text[idx:]
    while text.startswith(THINK_START):
        text = text[len(THINK_START) :]
    if THINK_END not in text:
        return Split(reasoning=text, content=prefix)  # cut off inside the thinking block
    reasoning, content = text.split(THINK_END, 1)
    return Split(reasoning=reasoning, content=prefix + content)


class _State(enum.Enum):
    BEFORE = "before"  # not forced, no <think> seen yet: content
    START = "start"  # just entered the block: strip repeated <think>
    REASONING = "reasoning"
    AFTER = "after"  # after </think>: content


class StreamingSplitter:
    """Incremental ``split_reasoning``: feed text deltas, get (reasoning, content) deltas.

    Concatenating all deltas (``feed``... then ``flush``) equals ``split_reasoning`` of the whole text: a
    possible partial tag at the end of the buffer is held back until more text (or ``flush``) decides it.
    """

    def __init__(self, force: bool) -> None:
        self._state = _State.START if force else _State.BEFORE
        self._buf = ""

    def feed(self, delta: str) -> Split:
        self._buf += delta
        return self._drain(final=False)

    def flush(self) -> Split:
        return self._drain(final=True)

    def _drain(self, final: bool) -> Split:
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            if self._state is _State.AFTER:
                content.append(self._buf)
                self._buf = ""
            elif self._state is _State.START:
                if self._buf.startswith(THINK_START):
                    self._buf = self._buf[len(THINK_START) :]
                elif THINK_START.startswith(self._buf) and not final:
                    break  # may still become <think>
                else:
                    self._state = _State.REASONING
            else:
                tag = THINK_START if self._state is _State.BEFORE else THINK_END
                out = content if self._state is _State.BEFORE else reasoning
                idx = self._buf.find(tag)
                if idx >= 0:
                    out.append(self._buf[:idx])
                    self._buf = self._buf[idx + len(tag) :]
                    self._state = _State.START if self._state is _State.BEFORE else _State.AFTER
                    if self._state is _State.START:
                        self._buf = THINK_START + self._buf  # let START strip it with any repeats
                    continue
                keep = 0 if final else _partial_suffix(self._buf, tag)
                out.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
        return Split(reasoning="".join(reasoning), content="".join(content))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ``text`` ends with."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
