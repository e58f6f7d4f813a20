"""Read an inventory file into plain data (dicts, lists, str, int, float, bool, None), bounded and strict.

The YAML is parsed by PyYAML's safe parser and composer; this module builds the values itself so that
- input is bounded: file size (MAX_BYTES), nesting depth (MAX_DEPTH), aliases used (MAX_ALIASES) and values
  after alias and merge expansion (MAX_VALUES); an alias bomb or a recursive alias is one clear error;
- the text is UTF-8 (a UTF-8 BOM is dropped, CRLF line ends read as LF); anything else is refused by name;
- keys are their source text (`7` and `"7"` are the same key, so a collision is a duplicate-key error);
- merge keys (`<<: *defaults`, `<<: [*a, *b]`) work as in YAML 1.1; duplicate keys are refused;
- YAML 1.1 surprises are refused with a hint to quote: octal/hex/binary/base-60/underscored numbers
  (`port: 030000` is 12288 in YAML 1.1), yes/no/on/off booleans, dates, .inf/.nan, and any explicit tag but
  the standard str/int/float/bool/null/seq/map;
- a token-shaped literal (sk-..., hf_..., ...) anywhere, key or value, is refused without showing it.
Every error is one InventoryError; user text appears only as `rules.excerpt`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer

from opsctl import yamlload
from opsctl.errors import InventoryError
from opsctl.inventory.rules import SECRET_HINT, clean, excerpt, token_kind
from opsctl.inventory.schema import join

MAX_BYTES = 1024 * 1024  # an inventory for hundreds of hosts is well under 100 KiB
MAX_DEPTH = 32  # mappings/lists inside each other (the schema needs 6)
MAX_ALIASES = 1000  # `*name` references in one file
MAX_VALUES = 100_000  # values after alias and merge expansion
MAX_NUMBER_TEXT = 32  # characters of a number as written

_TAG = "tag:yaml.org,2002:"
LIBYAML = yamlload.LIBYAML
_QUOTE_HINT = "quote it if you meant the text"


class PlainInt(int):
    """An int read from YAML, remembering how it was written (a string field takes the text as written)."""

    source: str


class PlainFloat(float):
    """A float read from YAML, remembering how it was written (`1.10` stays "1.10" in a string field)."""

    source: str


def read_file(file: Path) -> Any:
    """The inventory file's data. InventoryError when it is missing, too big, not UTF-8 or not valid YAML."""
    shown = clean(str(file), 120)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InventoryError("", f"inventory file {shown} not found", "pass an existing file with -i") from None
    except OSError as exc:
        raise InventoryError("", f"cannot read inventory {shown}: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise InventoryError(
            "", f"{shown} is larger than {MAX_BYTES // 1024} KiB, the inventory size limit", "split the inventory"
        )
    return parse_text(decode(raw, shown), shown)


def decode(raw: bytes, shown: str) -> str:
    """UTF-8 text with a BOM dropped and CRLF/CR line ends made LF."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InventoryError("", f"{shown} is UTF-16 (or UTF-32) encoded", "save it as UTF-8")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InventoryError(
            "", f"{shown} is not valid UTF-8 (byte {exc.start}, line {line})", "save it as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse_text(text: str, shown: str = "<inventory>", libyaml: bool = LIBYAML) -> Any:
    """YAML text to plain data, with the limits and refusals above.

    `libyaml`: parse with libyaml's C parser where it agrees with PyYAML's (`yamlload.agrees`: no tab, BOM,
    `?`, tag...); a text libyaml refuses is read again by PyYAML for the message (libyaml words and places
    syntax errors differently): the data and every message are PyYAML's (tests/unit/test_inventory_reader.py)."""
    if libyaml and yamlload.agrees(text):
        try:
            return _Direct(text).document()
        except _Unsure:
            pass  # the node reading below decides, and words any refusal
        try:
            node = _compose(text, shown, libyaml=True)
            return None if node is None else _Builder().value(node, "", 0)
        except InventoryError:
            pass  # PyYAML's reading below gives the message (libyaml found the same fault)
    node = _compose(text, shown, libyaml=False)
    if node is None:
        return None
    return _Builder().value(node, "", 0)


def _compose(text: str, shown: str, libyaml: bool) -> yaml.Node | None:
    loader: _Counting | None = None
    try:
        loader = _loader(text, libyaml)  # the pure reader refuses unprintable characters here
        node = loader.get_single_node()
    except _TooDeep as exc:
        raise InventoryError(
            "", f"{shown}: nested deeper than {MAX_DEPTH} levels at line {exc.line}", "flatten the structure"
        ) from None
    except _TooManyAliases as exc:
        raise InventoryError(
            "", f"{shown}: more than {MAX_ALIASES} aliases (line {exc.line})", "write the values out"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        if isinstance(exc, yaml.reader.ReaderError):
            code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "?")
            problem = f"character U+{code:04X} is not allowed in YAML"
            where = f" at position {exc.position}"
        else:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InventoryError("", f"{shown}: YAML syntax error{where}: {clean(problem, 100)}", "fix the YAML") from None
    finally:
        if loader is not None:
            loader.dispose()  # type: ignore[attr-defined]
    return node


class _Unsure(Exception):
    """The direct reading stopped: the node reading decides (it accepts or refuses with the message)."""


_DIRECT_DEPTH = MAX_DEPTH // 2  # deeper texts are left to the node reading, which owns the depth limits
_SCALAR_EVENT, _MAPPING_START, _SEQUENCE_START = yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent
_MAPPING_END, _SEQUENCE_END = yaml.MappingEndEvent, yaml.SequenceEndEvent


class _Direct:
    """libyaml's events straight to values, with no nodes (a 1 MiB inventory's read in a third of the node
    reading's time, docs/inventory.md). Only for the common case: a text with an anchor, alias, merge key, tag,
    duplicate key, non-word key, a scalar the builder would refuse or any other doubt raises `_Unsure`, and the
    node reading (`_compose` + `_Builder`) gives the data or the message. So every refusal and every message
    stays the node reading's; this path only accepts texts the node reading accepts, with the same data
    (tests/unit/test_inventory_reader.py compares both on the fuzzed texts). Each distinct scalar text is
    resolved and checked once (an inventory repeats the same few hundred words)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.count = 0
        self.kinds: dict[tuple[str, bool], str] = {}  # (text, plain) -> "str" | "int" | "float" | "null" | "bool"
        self.words: set[str] = set()  # key texts already checked for token shapes

    def document(self) -> Any:
        loader = yaml.CSafeLoader(self.text)
        try:
            self.next = loader.get_event
            self.resolve: Any = loader.resolve
            events = [type(self.next()) for _ in range(2)]
            if events != [yaml.StreamStartEvent, yaml.DocumentStartEvent]:
                raise _Unsure  # an empty text, or something before the document
            value = self.value(self.next(), 0)
            if type(self.next()) is not yaml.DocumentEndEvent or type(self.next()) is not yaml.StreamEndEvent:
                raise _Unsure  # a second document: the node reading refuses it
            return value
        except yaml.YAMLError:
            raise _Unsure from None
        finally:
            loader.dispose()

    def value(self, event: Any, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_VALUES or depth >= _DIRECT_DEPTH or event.anchor is not None:
            raise _Unsure
        kind = type(event)
        if kind is _SCALAR_EVENT:
            return self.scalar(event)
        if event.tag is not None:
            raise _Unsure
        if kind is _MAPPING_START:
            mapping: dict[str, Any] = {}
            while True:
                key = self.next()
                if type(key) is _MAPPING_END:
                    return mapping
                word = self.key(key)
                if word in mapping:
                    raise _Unsure  # duplicate key
                mapping[word] = self.value(self.next(), depth + 1)
        if kind is _SEQUENCE_START:
            items: list[Any] = []
            while True:
                item = self.next()
                if type(item) is _SEQUENCE_END:
                    return items
                items.append(self.value(item, depth + 1))
        raise _Unsure  # an alias

    def key(self, event: Any) -> str:
        if type(event) is not _SCALAR_EVENT or event.anchor is not None or event.tag is not None:
            raise _Unsure
        word: str = event.value
        if word not in self.words:
            if self.kind(event) not in ("str", "int", "float", "null", "bool") or token_kind(word) is not None:
                raise _Unsure  # a merge key `<<`, or a token-shaped key
            self.words.add(word)
        return word

    def kind(self, event: Any) -> str:
        """What the builder makes of this scalar; "" when it would refuse it or the direct reading cannot say."""
        text: str = event.value
        plain = bool(event.implicit[0])
        found = self.kinds.get((text, plain))
        if found is None:
            tag: str = self.resolve(yaml.ScalarNode, text, event.implicit)
            found = self.kinds[(text, plain)] = _scalar_kind(text, tag)
        return found

    def scalar(self, event: Any) -> Any:
        if event.tag is not None:
            raise _Unsure
        found = self.kind(event)
        text: str = event.value
        if found == "str":
            return text
        if found == "int":
            number = PlainInt(text)
            number.source = text
            return number
        if found == "float":
            real = PlainFloat(text)
            real.source = text
            return real
        if found == "null":
            return None
        if found == "bool":
            return _BOOL[text]
        raise _Unsure


def _scalar_kind(text: str, tag: str) -> str:
    """The builder's reading of a scalar with this text and resolved tag ("" where it refuses or would need a
    closer look: `_Builder.scalar` is the reference)."""
    if tag in (_TAG + "str", _TAG + "value"):
        return "str" if token_kind(text) is None else ""
    if tag == _TAG + "null":
        return "null"
    if tag == _TAG + "bool":
        return "bool" if text in _BOOL else ""
    if tag in (_TAG + "int", _TAG + "float") and len(text) > MAX_NUMBER_TEXT:
        return ""
    if tag == _TAG + "int":
        return "int" if _DECIMAL.fullmatch(text) else ""
    if tag == _TAG + "float":
        return "float" if _FLOAT.fullmatch(text) else ""
    return ""  # merge (`<<` as a value), timestamp, anything else


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _TooManyAliases(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


# libyaml's reader, scanner and parser (C) when PyYAML was built with it: 4x faster on a 1 MiB inventory
# (docs/inventory.md). Its C composer is not used: it recurses without a limit (`[` x 100000 is a segfault) and
# cannot count aliases; PyYAML's composer (Python) reads libyaml's events and counts both (compose_node).
class _Counting(Composer):
    """PyYAML's composer, counting depth and aliases; mixed into the safe parser of either implementation.
    The loader's constructor is never used: `_Builder` makes the values."""

    def __init__(self) -> None:
        self.anchors: dict[str, yaml.Node] = {}
        self._depth = 0
        self._aliases = 0
        self._tags: dict[tuple[str, tuple[bool, bool]], str] = {}  # scalar (text, implicit) -> resolved tag

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: Any) -> str:
        """The resolver's tag, remembered per scalar text: an inventory repeats the same few hundred words (a
        safe loader has no path resolvers, so a scalar's tag depends on its text and `implicit` alone)."""
        if kind is not yaml.ScalarNode:
            return super().resolve(kind, value, implicit)  # type: ignore[misc,no-any-return]
        key = (value, implicit)
        tag = self._tags.get(key)
        if tag is None:
            tag = self._tags[key] = super().resolve(kind, value, implicit)  # type: ignore[misc]
        return tag

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[attr-defined]
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _TooManyAliases(line)
        if self._depth >= MAX_DEPTH:
            raise _TooDeep(line)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _PyLoader(_Counting, yaml.SafeLoader):
    """PyYAML's pure-Python reader (refuses unprintable characters when built), scanner, parser, resolver."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        _Counting.__init__(self)


if LIBYAML:

    class _CLoader(_Counting, yaml.CSafeLoader):
        """libyaml's reader, scanner and parser; Python's composer (the MRO puts _Counting's first)."""

        def __init__(self, stream: str) -> None:
            yaml.CSafeLoader.__init__(self, stream)
            _Counting.__init__(self)


def _loader(text: str, libyaml: bool) -> _Counting:
    return _CLoader(text) if libyaml and LIBYAML else _PyLoader(text)


_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_CONSTRUCT = yaml.constructor.SafeConstructor()


class _Builder:
    """Nodes to values. Counts every value built (aliases expand) and refuses recursion through aliases."""

    def __init__(self) -> None:
        self.count = 0
        self.open: set[int] = set()  # ids of the collection nodes being built (an alias back to one = recursion)

    def _tick(self, node: yaml.Node, path: str, depth: int) -> None:
        self.count += 1
        line = node.start_mark.line + 1
        if self.count > MAX_VALUES:
            raise InventoryError(
                path, f"the inventory expands to more than {MAX_VALUES} values (line {line})", "use fewer aliases"
            )
        if depth > MAX_DEPTH:
            raise InventoryError(path, f"nested deeper than {MAX_DEPTH} levels after alias expansion (line {line})")
        if id(node) in self.open:
            raise InventoryError(path, f"an alias refers to a mapping or list that contains it (line {line})")

    def value(self, node: yaml.Node, path: str, depth: int) -> Any:
        self._tick(node, path, depth)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode) and node.tag == _TAG + "seq":
                return [self.value(child, join(path, i), depth + 1) for i, child in enumerate(node.value)]
            if isinstance(node, yaml.MappingNode) and node.tag == _TAG + "map":
                return {key: self.value(child, join(path, key), depth + 1) for key, child in self.pairs(node, path)}
        finally:
            self.open.discard(id(node))
        raise InventoryError(path, f"the YAML tag {clean(node.tag, 40)} is not supported", "remove the tag")

    def pairs(self, node: yaml.MappingNode, path: str) -> list[tuple[str, yaml.Node]]:
        """The mapping's (key, value node) pairs, merge keys expanded: own keys win over merged ones, and of
        `<<: [*a, *b]` the earlier mapping wins (YAML 1.1 merge). Duplicate own keys are refused."""
        own: list[tuple[str, yaml.Node]] = []
        merged: list[tuple[str, yaml.Node]] = []
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise InventoryError(path, f"a key must be a plain word, not a list or mapping (line {line})")
            key = key_node.value
            kind = token_kind(key)
            if kind is not None:
                raise InventoryError(path, f"a key at line {line} looks like a literal secret ({kind})", SECRET_HINT)
            if key in seen:
                raise InventoryError(
                    path,
                    f"duplicate key {excerpt(key)} (lines {seen[key]} and {line}; keys compare as text, "
                    'so 7 and "7" are the same key)',
                    "remove one of them",
                )
            seen[key] = line
            if key_node.tag == _TAG + "merge":
                merged = self.merge(value_node, path) + merged
            else:
                own.append((key, value_node))
        return merged + own

    def merge(self, node: yaml.Node, path: str) -> list[tuple[str, yaml.Node]]:
        self._tick(node, join(path, "<<"), 0)
        if isinstance(node, yaml.MappingNode):
            sources = [node]
        elif isinstance(node, yaml.SequenceNode) and all(isinstance(n, yaml.MappingNode) for n in node.value):
            sources = list(node.value)
        else:
            line = node.start_mark.line + 1
            raise InventoryError(join(path, "<<"), f"a merge key takes a mapping or a list of mappings (line {line})")
        pairs: list[tuple[str, yaml.Node]] = []
        self.open.add(id(node))
        try:
            for source in reversed(sources):  # later sources first, so earlier ones override them
                self.open.add(id(source))
                try:
                    pairs += self.pairs(source, path)
                finally:
                    self.open.discard(id(source))
        finally:
            self.open.discard(id(node))
        return pairs

    def scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        text: str = node.value
        tag = node.tag
        if tag in (_TAG + "str", _TAG + "merge", _TAG + "value"):
            kind = token_kind(text)
            if kind is not None:
                raise InventoryError(path, f"looks like a literal secret ({kind})", SECRET_HINT)
            return text
        if tag == _TAG + "null":
            return None
        if tag == _TAG + "bool":
            if text in _BOOL:
                return _BOOL[text]
            raise InventoryError(
                path, f"{excerpt(text)} is a YAML 1.1 boolean", f"write true or false, or {_QUOTE_HINT}"
            )
        if tag in (_TAG + "int", _TAG + "float") and len(text) > MAX_NUMBER_TEXT:
            raise InventoryError(path, f"a number of {len(text)} characters is too long", _QUOTE_HINT)
        if tag == _TAG + "int":
            if _DECIMAL.fullmatch(text):
                number = PlainInt(text)
                number.source = text
                return number
            raise InventoryError(
                path, f"{excerpt(text)} is read as the number {_number(node)} by YAML 1.1", _number_hint(text)
            )
        if tag == _TAG + "float":
            if _FLOAT.fullmatch(text):
                real = PlainFloat(text)
                real.source = text
                return real
            raise InventoryError(
                path, f"{excerpt(text)} is read as the number {_number(node)} by YAML 1.1", _number_hint(text)
            )
        if tag == _TAG + "timestamp":
            raise InventoryError(path, f"{excerpt(text)} is read as a date by YAML", _QUOTE_HINT)
        raise InventoryError(path, f"the YAML tag {clean(tag, 40)} is not supported", "remove the tag")


def _number(node: yaml.ScalarNode) -> str:
    """What YAML 1.1 makes of a number written in a surprising way (030000 -> 12288), for the message."""
    if len(node.value) > MAX_NUMBER_TEXT:
        return "(too long to show)"
    build = _CONSTRUCT.construct_yaml_int if node.tag == _TAG + "int" else _CONSTRUCT.construct_yaml_float
    try:
        value = build(node)
    except (yaml.YAMLError, ValueError, ArithmeticError):
        return "(unreadable)"
    return excerpt(value, 24)


def _number_hint(text: str) -> str:
    if ":" in text:
        return f"YAML 1.1 reads a:b as base 60; {_QUOTE_HINT}"
    return f"write a plain decimal number, or {_QUOTE_HINT}"
