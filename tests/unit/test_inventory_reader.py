"""The reader with libyaml's C parser (a 1 MiB inventory read 4x faster) gives PyYAML's data and
PyYAML's messages: every text is read both ways and compared, values (with their types) or the error line."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import yamlload
from opsctl.errors import InventoryError
from opsctl.inventory import reader
from tests.unit.big_inventory import big_inventory
from tests.unit.test_inventory_property import YAML_BITS

pytestmark = pytest.mark.skipif(not reader.LIBYAML, reason="PyYAML built without libyaml")

# Each one was read differently by libyaml and PyYAML before the reader sent it to PyYAML alone.
DISAGREED = [
    "a\t: 1\n", "- b:\t c\n", "a: 1\n\ufeff", "x: {a?: 1}\n", "x: [1, 2?]\n", "x: |#\n  t\n", "- b:  !\n",
    "x: {a: [!1, 2]}\n", "a: 1\u2028b: 2\n", "': 1\n", "k: 'v'\n1", "a: \"é\x07\n",
]  # fmt: skip
# Mutations of these (one to four characters inserted or deleted) were fuzzed both ways: 160,000 texts agreed.
_SEEDS = ["a: 1\n", "hosts:\n  x: {a: [1, 2]}\n", "- a\n- b: c\n", "a: &x {b: 1}\nc: *x\n", "x: |\n  t\n"]
_CHARS = list(":-[]{},&*!|>'\"#\n \t%@`?éx1.0~+=\\\x07\x85\u2028\ufeff")


def _read(text: str, libyaml: bool) -> tuple[str, Any]:
    try:
        data = reader.parse_text(text, "<f>", libyaml=libyaml)
    except InventoryError as exc:
        return "error", exc.one_line()
    return "data", _typed(data)


def _typed(value: Any) -> Any:
    """The value with each scalar's type (PlainInt vs str vs None...), so 1 and "1" never compare equal."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("text", DISAGREED)
def test_texts_the_parsers_disagree_on_read_as_pyyaml_reads_them(text: str) -> None:
    assert _read(text, libyaml=True) == _read(text, libyaml=False)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    text = list(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()) or not text:
            text.insert(at, draw(st.sampled_from(_CHARS)))
        else:
            del text[min(at, len(text) - 1)]
    return "".join(text)


@settings(max_examples=400, derandomize=True, deadline=None, database=None)
@given(st.one_of(_mutated(), st.lists(YAML_BITS, max_size=30).map("".join)))
def test_libyaml_reads_as_pyyaml(text: str) -> None:
    assert _read(text, libyaml=True) == _read(text, libyaml=False)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    # libyaml's own composer recurses in C without a limit: this text is a segfault through yaml.CSafeLoader
    with pytest.raises(InventoryError, match="nested deeper than 32 levels at line 1"):
        reader.parse_text("[" * 100_000, libyaml=True)


def test_a_generated_inventory_reads_the_same() -> None:
    text = big_inventory(60)
    assert _read(text, libyaml=True) == _read(text, libyaml=False)


def test_rendered_server_yaml_is_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from opsctl.inventory.load import parse_inventory
    from opsctl.render import render_service

    monkeypatch.setenv("OPSCTL_BIG_KEY", "k")
    inv = parse_inventory(reader.parse_text(big_inventory(3)))
    for host in inv.hosts:
        for svc in host.services:
            text = render_service(host, svc, "20260101T000000Z-abc123abc123").server_config
            assert yamlload.agrees(text) and yamlload.safe_load(text) == yaml.safe_load(text)


def _direct(text: str) -> tuple[str, Any]:
    try:
        return "data", _typed(reader._Direct(text).document())
    except reader._Unsure:
        return "unsure", None


@settings(max_examples=400, derandomize=True, deadline=None, database=None)
@given(st.one_of(_mutated(), st.lists(YAML_BITS, max_size=30).map("".join)))
def test_the_direct_reading_accepts_only_what_the_node_reading_accepts_with_its_data(text: str) -> None:
    if not yamlload.agrees(text):
        return  # parse_text never tries it there
    direct = _direct(text)
    if direct[0] == "data":
        assert direct == _read(text, libyaml=False)


@pytest.mark.parametrize(
    "text",
    [
        "a: &x {b: 1}\nc: *x\n",  # anchors and aliases
        "base: {p: 1}\nh: {<<: {q: 2}}\n",  # a merge key
        "a: 1\na: 2\n",  # a duplicate key (the message names both lines)
        "[1]: 2\n",  # a key that is not a word
        "port: 030000\n",  # YAML 1.1's octal
        "ok: yes\n",  # YAML 1.1's boolean
        "k: sk-" + "a1" * 20 + "\n",  # a token-shaped value
        "a: 1\n---\nb: 2\n",  # two documents
        "",  # nothing
        "a: [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]\n",  # deeper than the direct reading goes
    ],
)
def test_the_direct_reading_leaves_every_doubt_to_the_node_reading(text: str) -> None:
    assert _direct(text) == ("unsure", None)
    assert _read(text, libyaml=True) == _read(text, libyaml=False)


def test_a_generated_inventory_is_read_directly() -> None:
    text = big_inventory(40)
    assert _direct(text) == _read(text, libyaml=False)
    assert _direct(text)[0] == "data"
