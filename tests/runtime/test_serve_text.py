"""ddtree.serve text handling: reasoning split (SGLang qwen3 parser), stop strings, SSE framing, auth."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from ddtree.serve import sse
from ddtree.serve.auth import authorized, is_exempt
from ddtree.serve.reasoning import Split, StreamingSplitter, forced_reasoning, split_reasoning
from ddtree.serve.textout import TextAssembler
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime


@pytest.mark.parametrize(
    ("text", "force", "reasoning", "content"),
    [
        ("Here's a thinking process", True, "Here's a thinking process", ""),  # cut off: all reasoning
        ("think hard</think>\n\n4", True, "think hard", "\n\n4"),
        ("<think>think</think>4", True, "think", "4"),
        ("<think><think>x</think>y", True, "x", "y"),
        ("4", False, "", "4"),
        ("<think>a</think>b", False, "a", "b"),
        ("pre<think>a</think>b", False, "a", "preb"),
        ("a</think>b", False, "", "a</think>b"),  # thinking off and no opening tag: no reasoning
    ],
)
def test_split_reasoning(text: str, force: bool, reasoning: str, content: str) -> None:
    assert split_reasoning(text, force) == Split(reasoning, content)


def test_forced_reasoning_follows_enable_thinking() -> None:
    assert forced_reasoning("qwen3", None) is True
    assert forced_reasoning("qwen3", {"enable_thinking": False}) is False
    assert forced_reasoning("qwen3-thinking", {"enable_thinking": False}) is True


def _stream(pieces: Sequence[str], force: bool) -> Split:
    s = StreamingSplitter(force)
    parts = [s.feed(p) for p in pieces] + [s.flush()]
    return Split("".join(p.reasoning for p in parts), "".join(p.content for p in parts))


def test_streaming_holds_back_partial_tags() -> None:
    s = StreamingSplitter(force=True)
    assert s.feed("abc</th") == Split("abc", "")
    assert s.feed("ink>\n\nhi") == Split("", "\n\nhi")
    assert s.flush() == Split("", "")


_ALPHABET = st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", "a", "b", "\n", "<th", "ink>"])


@given(st.lists(_ALPHABET, max_size=12), st.booleans(), st.data())
def test_streaming_equals_one_shot(tokens: list[str], force: bool, data: st.DataObject) -> None:
    text = "".join(tokens)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert _stream(pieces, force) == split_reasoning(text, force)


def _toy_decode(vocab: dict[int, str]) -> Callable[[Sequence[int]], str]:
    return lambda ids: "".join(vocab[i] for i in ids)


def test_stop_string_cuts_text_and_tokens() -> None:
    vocab = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!"}
    t = TextAssembler(_toy_decode(vocab), stop=["o w"])
    assert t.add([1]) == "Hel"
    assert t.add([2]) == "l"  # "o" could start the stop string: held back
    assert t.add([3, 4, 5]) == ""  # the stop string appeared; the round's later tokens are dropped
    assert t.stop is not None and t.stop.text == "o w"
    assert t.text == "Hell" and t.tokens == [1, 2, 3]
    assert t.finish() == "" and t.add([5]) == ""


def test_no_stop_emits_everything_and_holds_partial_utf8() -> None:
    decoded = {(1,): "a", (1, 2): "a\ufffd", (1, 2, 3): "aéb"}
    t = TextAssembler(lambda ids: decoded[tuple(ids)])
    assert t.add([1]) == "a"
    assert t.add([2]) == ""  # half a character: wait
    assert t.add([3]) == "éb"
    assert t.finish() == "" and t.stop is None


def test_held_back_prefix_is_released_at_finish() -> None:
    t = TextAssembler(_toy_decode({1: "ab", 2: "c"}), stop=["cd"])
    assert t.add([1, 2]) == "ab"
    assert t.finish() == "c" and t.text == "abc" and t.stop is None


def test_earliest_stop_wins() -> None:
    t = TextAssembler(_toy_decode({1: "xx", 2: "STOP", 3: "END"}), stop=["END", "STOP"])
    t.add([1, 2, 3])
    assert t.stop is not None and (t.stop.text, t.text, t.tokens) == ("STOP", "xx", [1, 2])


def test_sse_round_trip() -> None:
    body = sse.event({"a": 1, "t": "é"}) + sse.event({"b": [1, 2]}) + sse.DONE
    assert body.startswith('data: {"a":1,"t":"é"}\n\n')
    assert sse.parse_events(body) == [{"a": 1, "t": "é"}, {"b": [1, 2]}, "[DONE]"]
    with pytest.raises(ValueError, match="not an SSE data line"):
        sse.parse_events("event: x\n\n")


def test_auth() -> None:
    assert authorized("Bearer k", "k") and authorized("bearer k", "k")
    assert not authorized(None, "k") and not authorized("Bearer x", "k") and not authorized("k", "k")
    # SGLang splits once on a space and compares the rest exactly: extra or other whitespace is a wrong key
    for header in ("Bearer  k", "Bearer k ", "Bearer\tk", "Bearer", "Bearer ", "", " Bearer k"):
        assert not authorized(header, "k"), repr(header)
    assert is_exempt("/health", "GET") and is_exempt("/health_generate", "GET") and is_exempt("/metrics", "GET")
    assert is_exempt("/ready", "GET") and not is_exempt("/v1/models", "GET") and not is_exempt("/generate", "POST")


def test_no_stop_trim_keeps_the_matched_stop_string() -> None:
    decode = "".join  # a toy tokenizer: one token per character
    trimmed, kept = TextAssembler(decode, ["cd"]), TextAssembler(decode, ["cd"], keep_stop=True)
    assert [trimmed.add(list(c)) for c in ("ab", "cde")] == ["ab", ""]
    assert [kept.add(list(c)) for c in ("ab", "cde")] == ["ab", "cd"]
    assert (trimmed.text, kept.text) == ("ab", "abcd")
    assert trimmed.tokens == kept.tokens == list("abcd")  # the tokens stop where the stop string completed
