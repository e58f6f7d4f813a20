"""opsctl.systemd: the readers follow systemd's rules, the writers round-trip through them, and render refuses
any file whose meaning to systemd differs from what was intended."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import systemd
from opsctl.inventory.load import load_inventory
from opsctl.inventory.model import Mode
from opsctl.render import render_service, server_env
from opsctl.systemd import (
    SystemdSyntaxError,
    check_env_file,
    check_unit,
    exec_argv,
    expand_specifiers,
    parse_env_file,
    parse_unit,
    quote_env,
    quote_exec,
)
from tests.conftest import REPO

ARG_TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=40)


def test_exec_argv_follows_systemd_rules() -> None:
    assert exec_argv('/bin/a "b c" \'d e\' f\\x41 "g\\"h" $$HOME \\s') == (
        "/bin/a",
        "b c",
        "d e",
        "fA",
        'g"h',
        "$HOME",
        " ",
    )
    assert exec_argv('/bin/a x"y z"w') == ("/bin/a", "xy zw")  # quotes may start mid-word
    assert exec_argv(expand_specifiers("/bin/a 100%%")) == ("/bin/a", "100%")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-/bin/a", "command prefix"),
        ("/bin/a ; /bin/b", "second command"),
        ('/bin/a "b', "unbalanced quote"),
        ("/bin/a \\q", "escape systemd refuses"),
        ("/bin/a $HOME", "$variable"),
        ("/bin/a ${HOME}", "$variable"),
        ("/bin/a b\\", "ends with a backslash"),
        ("", "empty"),
    ],
)
def test_exec_argv_refuses_what_opsctl_never_means(value: str, problem: str) -> None:
    with pytest.raises(SystemdSyntaxError, match=problem.replace("$", r"\$")):
        exec_argv(value)


def test_specifiers_other_than_double_percent_are_refused() -> None:
    with pytest.raises(SystemdSyntaxError, match="specifier"):
        expand_specifiers("/opt/%n")


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(ARG_TEXT.filter(lambda a: a != ";"), min_size=1, max_size=6))
def test_quote_exec_round_trips(argv: list[str]) -> None:
    argv = ["/venv/bin/python", *argv]
    line = " ".join(quote_exec(a) for a in argv)
    assert "\n" not in line and "\r" not in line
    assert exec_argv(expand_specifiers(line)) == tuple(argv)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), ARG_TEXT), max_size=6))
def test_quote_env_round_trips(pairs: list[tuple[str, str]]) -> None:
    text = "# header\n" + "".join(f"{k}={quote_env(v)}\n" for k, v in pairs)
    assert parse_env_file(text) == pairs


def test_env_file_follows_systemd_rules() -> None:
    text = '# c\n; c\nA=1\n B = two words  \nC=\'x"y\'\nD="a\\$b\\qc"\nE=a\\\nb\n1X=dropped\nF\n'
    assert parse_env_file(text) == [("A", "1"), ("B", "two words"), ("C", 'x"y'), ("D", "a$b\\qc"), ("E", "ab")]


def test_unit_parser_reads_continuations_comments_and_sections() -> None:
    text = "# c\n[Unit]\nDescription=a \\\n  b\n; c\n[Service]\nExecStart=/bin/x\n"
    got = [(d.section, d.key, d.value) for d in parse_unit(text)]
    assert got == [("Unit", "Description", "a  b"), ("Service", "ExecStart", "/bin/x")]
    with pytest.raises(SystemdSyntaxError, match="before the first"):
        parse_unit("A=1\n")
    with pytest.raises(SystemdSyntaxError, match="not a Key=Value"):
        parse_unit("[Unit]\njunk\n")


def test_check_unit_catches_an_injected_line() -> None:
    expected = [("Unit", "Description", "x"), ("Service", "ExecStart", "/bin/x")]
    check_unit("[Unit]\nDescription=x\n[Service]\nExecStart=/bin/x\n", expected, ("/bin/x",), "u")
    with pytest.raises(SystemdSyntaxError, match=r"unexpected Service\.ExecStartPre"):
        check_unit(
            "[Unit]\nDescription=x\n[Service]\nExecStartPre=/bin/sh\nExecStart=/bin/x\n", expected, ("/bin/x",), "u"
        )
    with pytest.raises(SystemdSyntaxError, match="argument 1 differs"):
        check_unit("[Unit]\nDescription=x\n[Service]\nExecStart=/bin/x y\n", expected, ("/bin/x", "z"), "u")


def test_check_env_file_catches_an_injected_variable() -> None:
    with pytest.raises(SystemdSyntaxError, match="an unexpected variable PATH"):
        check_env_file("FOO=1\nPATH=/tmp\n", [("FOO", "1\nPATH=/tmp")], "env")


@pytest.fixture
def ct200():  # type: ignore[no-untyped-def]
    inv = load_inventory(REPO / "inventory/ct200.yaml")
    return inv.hosts[0], inv.hosts[0].services[0]


def test_rendered_files_mean_what_was_intended(ct200) -> None:  # type: ignore[no-untyped-def]
    host, svc = ct200
    svc = replace(svc, extra_args=("--x", 'a "b" $c %d\\e\nf'), extra_env=(("FOO", 'a "b" $c\n`d`'),))
    rendered = render_service(host, svc, "r1")
    assert exec_argv(expand_specifiers(next(d.raw for d in parse_unit(rendered.unit) if d.key == "ExecStart"))) == (
        rendered.exec_start
    )
    assert parse_env_file(rendered.env) == server_env(host, svc, rendered.release_dir)
    percent = render_service(host, replace(svc, name="gpu%n"), "r1")
    assert {d.key: d.value for d in parse_unit(percent.unit)}["SyslogIdentifier"] == "opsctl-gpu%n"


@pytest.mark.parametrize(
    ("change", "release", "problem"),
    [
        ({"name": "gpu0\nExecStartPre=/bin/sh"}, "r1", r"unit line 2: a setting before the first \[Section\]"),
        ({"name": "gpu0\n[Service]\nExecStartPre=/bin/sh"}, "r1", r"of 'gpu0\\n\[Service.*unexpected Service.Exec"),
        ({"mode": Mode.BASELINE, "draft_model": None}, "r1\n\n[Service]\nExecStartPre=/bin/sh", "unexpected"),
    ],
)
def test_render_refuses_a_file_systemd_would_read_otherwise(ct200, change, release, problem) -> None:  # type: ignore[no-untyped-def]
    """What the loader refuses cannot reach render; if it did (a bug), render refuses it too."""
    host, svc = ct200
    with pytest.raises(SystemdSyntaxError, match=problem):
        render_service(host, replace(svc, **change), release)


# The line-at-a-time and whole-value fast paths (rendering 2,200 services) read as the character walks.
_PLAIN = st.text(st.sampled_from(list("AB_z9=#; \t\r\n\x00$%-/.é")), max_size=60)


@settings(max_examples=500, derandomize=True, deadline=None, database=None)
@given(_PLAIN)
def test_a_plain_env_file_reads_as_the_character_walk_reads_it(text: str) -> None:
    assert systemd._parse_plain_env_file(text) == systemd._parse_env_file_chars(text)


@settings(max_examples=500, derandomize=True, deadline=None, database=None)
@given(_PLAIN)
def test_a_plain_exec_start_splits_as_the_character_walk_splits_it(text: str) -> None:
    assert [w for w in systemd._WORDS.split(text) if w] == systemd._exec_words(text, 1)


def test_the_fast_paths_are_taken_only_without_quotes_or_backslashes() -> None:
    assert systemd.parse_env_file("A='x  y'\nB=1 \n") == [("A", "x  y"), ("B", "1")]
    assert systemd.exec_argv("/bin/x 'a b' c\\x41") == ("/bin/x", "a b", "cA")
    assert systemd.exec_argv("/bin/x  a\tb") == ("/bin/x", "a", "b")
