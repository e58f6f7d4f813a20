"""Everything opsctl says to or reads from systemd, in one place. Pure: commands are `Cmd` values, the
readers parse text; running them is the caller's (through its connection).

Commands and facts: `systemctl` (show -> `UnitState`, daemon-reload, enable, restart, disable, reset-failed),
`journalctl` (queries with cursors, the journal tail, the DDTREE lines) and `systemd-analyze verify`. Deploy,
the health gate, `status` and `logs` all build their systemd lines here.

Syntax: systemd's own rules for the two files opsctl writes: unit files and EnvironmentFiles.

`quote_exec` / `quote_env` / `escape_specifiers` write values; `parse_unit`, `exec_argv` and
`parse_env_file` read files back the way systemd would (src/shared/conf-parser.c, load-fragment.c
config_parse_exec with extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE), env-util.c replace_env,
basic/env-file.c parse_env_file). The readers are strict where systemd would substitute something opsctl
never means (a `%` specifier, a `$VAR`, an unknown escape): those are errors, so a rendered file passes only
when systemd would see exactly the intended directives, argv and variables. render.py checks every file
with them before it is returned.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from opsctl.commands import Cmd, sh
from opsctl.errors import DeployError, OpsctlError


class SystemdSyntaxError(OpsctlError):
    """A rendered file would not mean to systemd what opsctl intended. Never shows values (they may be secret)."""


_WHITESPACE = " \t\n\r"
_NEWLINES = re.compile(r"\r\n|\r|\n|\x00")
_BARE = re.compile(r"[A-Za-z0-9._=:/,+@-]+")  # needs no quoting in ExecStart or an EnvironmentFile
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- writing -------------------------------------------------------------------------------------------------


def escape_specifiers(value: str) -> str:
    """A unit setting's value with `%` doubled (systemd expands %-specifiers in most settings)."""
    return value.replace("%", "%%")


def quote_exec(arg: str) -> str:
    """One ExecStart argument: bare when safe, else double-quoted with C escapes; `%` and `$` doubled."""
    if _BARE.fullmatch(arg):
        return arg
    out = []
    for ch in arg:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "%":
            out.append("%%")
        elif ch == "$":
            out.append("$$")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def quote_env(value: str) -> str:
    """An EnvironmentFile value: bare when safe, else double-quoted with \\ before " \\ ` $ (env-file.c)."""
    if value == "" or _BARE.fullmatch(value):
        return value
    return '"' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


# --- reading unit files --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Directive:
    section: str
    key: str
    value: str  # after %-specifier expansion (only %% is allowed: it reads as %)
    raw: str  # as written (ExecStart is split from this)
    line: int


def parse_unit(text: str) -> list[Directive]:
    """Directives of a unit file as systemd reads them (conf-parser.c): lines end at LF, CR or NUL; `#`/`;`
    start comments; a trailing backslash continues the line; `[Section]` headers; `Key=Value` with
    whitespace stripped around both. Raises SystemdSyntaxError where systemd would warn or ignore."""
    directives: list[Directive] = []
    section: str | None = None
    pending = ""
    start = 0
    lines = _NEWLINES.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    for number, raw_line in enumerate(lines, 1):
        line = raw_line.strip(_WHITESPACE)
        if not pending and (not line or line[0] in "#;"):
            continue
        if pending and line[:1] in ("#", ";"):
            continue  # a comment inside a continuation is skipped
        if line.endswith("\\"):
            if not pending:
                start = number
            pending += line[:-1] + " "
            continue
        if pending:
            line, pending = pending + line, ""
        else:
            start = number
        if line.startswith("["):
            if not re.fullmatch(r"\[[A-Za-z][A-Za-z0-9-]*\]", line):
                raise SystemdSyntaxError(f"unit line {start}: invalid section header")
            section = line[1:-1]
            continue
        if section is None:
            raise SystemdSyntaxError(f"unit line {start}: a setting before the first [Section]")
        key, eq, value = line.partition("=")
        key, value = key.strip(_WHITESPACE), value.strip(_WHITESPACE)
        if not eq or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
            raise SystemdSyntaxError(f"unit line {start}: not a Key=Value setting")
        directives.append(Directive(section, key, expand_specifiers(value, start), value, start))
    if pending:
        raise SystemdSyntaxError(f"unit line {start}: the file ends inside a continued line")
    return directives


def expand_specifiers(value: str, line: int = 0) -> str:
    """`%%` -> `%`; any other specifier is an error (opsctl never means one)."""
    if "%" not in value:
        return value  # the common case, without the walk below
    out = []
    i = 0
    while i < len(value):
        if value[i] == "%":
            if value[i + 1 : i + 2] != "%":
                raise SystemdSyntaxError(f"unit line {line}: a %-specifier that opsctl did not mean")
            out.append("%")
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


def exec_argv(value: str, line: int = 0) -> tuple[str, ...]:
    """The argv systemd runs for an ExecStart= value (after %-expansion): words split on whitespace,
    quotes removed, C escapes decoded (extract_first_word), then `$$` -> `$` (replace_env). Errors for a
    command prefix (-@:+!|), `;` command separators, unbalanced quotes, unknown escapes and `$VAR`s."""
    if _QUOTED.search(value) is None:
        words = [word for word in _WORDS.split(value) if word]  # no quote or escape: words are what whitespace splits
    else:
        words = _exec_words(value, line)
    argv: list[str] = []
    for text in words:
        if not argv and text[:1] in tuple("-@:+!|"):
            raise SystemdSyntaxError(f"unit line {line}: ExecStart starts with a command prefix opsctl did not mean")
        if text == ";":
            raise SystemdSyntaxError(f"unit line {line}: ExecStart holds a second command (';')")
        argv.append(_replace_env(text, line))
    if not argv:
        raise SystemdSyntaxError(f"unit line {line}: ExecStart is empty")
    return tuple(argv)


_QUOTED = re.compile(r"[\\'\"]")  # a backslash or a quote: exec_argv walks the value character by character
_WORDS = re.compile(f"[{_WHITESPACE}]+")


def _exec_words(value: str, line: int) -> list[str]:
    """extract_first_word over the whole value: the words with quotes removed and escapes decoded."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in _WHITESPACE:
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote = ""
        while i < n:
            ch = value[i]
            if ch == "\\":
                decoded, used = _cunescape(value, i + 1, line)
                word.append(decoded)
                i += 1 + used
            elif quote:
                if ch == quote:
                    quote = ""
                else:
                    word.append(ch)
                i += 1
            elif ch in "'\"":
                quote = ch
                i += 1
            elif ch in _WHITESPACE:
                break
            else:
                word.append(ch)
                i += 1
        if quote:
            raise SystemdSyntaxError(f"unit line {line}: ExecStart has an unbalanced quote")
        words.append("".join(word))
    return words


def _cunescape(value: str, i: int, line: int) -> tuple[str, int]:
    """The character of the escape starting at value[i] (just after the backslash), and its length."""
    if i >= len(value):
        raise SystemdSyntaxError(f"unit line {line}: ExecStart ends with a backslash")
    ch = value[i]
    if ch in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[ch], 1
    for lead, digits, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if ch == lead:
            code = value[i + 1 : i + 1 + digits]
            if len(code) == digits and re.fullmatch(r"[0-9A-Fa-f]+", code) and int(code, base) > 0:
                return chr(int(code, base)), 1 + digits
            raise SystemdSyntaxError(f"unit line {line}: ExecStart has an invalid \\{lead} escape")
    if ch in "01234567":
        code = value[i : i + 3]
        if len(code) == 3 and re.fullmatch(r"[0-7]{3}", code) and int(code, 8) > 0:
            return chr(int(code, 8)), 3
    raise SystemdSyntaxError(f"unit line {line}: ExecStart has an escape systemd refuses")


def _replace_env(word: str, line: int) -> str:
    """`$$` -> `$`; a `$` starting a variable reference is an error (opsctl never means one)."""
    if "$" not in word:
        return word  # the common case, without the walk below
    out = []
    i = 0
    while i < len(word):
        if word[i] == "$":
            nxt = word[i + 1 : i + 2]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "{" or (nxt and (nxt.isalnum() or nxt == "_")):
                raise SystemdSyntaxError(f"unit line {line}: ExecStart has a $variable opsctl did not mean")
        out.append(word[i])
        i += 1
    return "".join(out)


# --- reading EnvironmentFiles --------------------------------------------------------------------------------


def parse_env_file(text: str) -> list[tuple[str, str]]:
    """The variables systemd sets from an EnvironmentFile (env-file.c parse_env_file_internal): `#`/`;`
    comment lines, KEY=VALUE with whitespace trimmed, single quotes literal, double quotes with \\ before
    " \\ ` $ (other backslashes kept), backslash-newline continuations. Assignments with an invalid name
    are dropped, as systemd drops them."""
    if _QUOTED.search(text) is None:
        return _parse_plain_env_file(text)
    return _parse_env_file_chars(text)


def _parse_plain_env_file(text: str) -> list[tuple[str, str]]:
    """parse_env_file for a text without quotes or backslashes, a line at a time: what the character walk
    below does there (tests/unit/test_systemd.py compares the two on generated texts)."""
    pairs: list[tuple[str, str]] = []
    for line in _LINE_ENDS.split(text):
        line = line.lstrip(" \t")
        if not line or line[0] in "#;":
            continue
        name, eq, value = line.partition("=")
        name = name.rstrip(" \t")
        if eq and _ENV_NAME.fullmatch(name):
            pairs.append((name, value.strip(" \t")))
    return pairs


_LINE_ENDS = re.compile("[\r\n]")


def _parse_env_file_chars(text: str) -> list[tuple[str, str]]:
    """parse_env_file, one character at a time as env-file.c does (quotes and escapes)."""
    pairs: list[tuple[str, str]] = []
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_ws: int | None = None
    value_ws: int | None = None

    def push() -> None:
        name = "".join(key if key_ws is None else key[:key_ws])
        val = "".join(value if value_ws is None else value[:value_ws])
        if _ENV_NAME.fullmatch(name):
            pairs.append((name, val))

    for c in text:
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in _WHITESPACE:
                state, key, key_ws = "key", [c], None
        elif state == "key":
            if c in "\n\r":
                state, key = "pre_key", []
            elif c == "=":
                state, value, value_ws = "pre_value", [], None
            else:
                if c not in _WHITESPACE:
                    key_ws = None
                elif key_ws is None:
                    key_ws = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in "\n\r":
                push()
                state, key, value = "pre_key", [], []
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in _WHITESPACE:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in "\n\r":
                push()
                state, key, value = "pre_key", [], []
            elif c == "\\":
                state, value_ws = "value_escape", None
            else:
                if c not in _WHITESPACE:
                    value_ws = None
                elif value_ws is None:
                    value_ws = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in "\n\r":
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in '"\\`$':
                value.append(c)
            elif c != "\n":
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in "\n\r":
                state = "pre_key"
        elif state == "comment_escape":
            state = "pre_key" if c in "\n\r" else "comment"
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        push()
    return pairs


# --- checks --------------------------------------------------------------------------------------------------


def check_unit(text: str, expected: list[tuple[str, str, str]], exec_start: tuple[str, ...], what: str) -> None:
    """`text` holds exactly the `expected` (section, key, value) directives in order, and its ExecStart runs
    exactly `exec_start`. `what` names the file in the error; no value is ever shown."""
    directives = parse_unit(text)
    got = [(d.section, d.key) for d in directives]
    want = [(section, key) for section, key, _ in expected]
    if got != want:
        extra = next((f"{s}.{k}" for s, k in got if (s, k) not in want), None)
        detail = f"an unexpected {extra}= line" if extra else "directives missing or out of order"
        raise SystemdSyntaxError(f"{what}: systemd would read {detail}", "a bug in opsctl's rendering; report it")
    for directive, (_, _, value) in zip(directives, expected, strict=True):
        if directive.key == "ExecStart":
            argv = exec_argv(directive.value, directive.line)
            if argv != exec_start:
                where = next(
                    (i for i, (a, b) in enumerate(zip(argv, exec_start, strict=False)) if a != b),
                    min(len(argv), len(exec_start)),
                )
                raise SystemdSyntaxError(
                    f"{what}: systemd would run a different command (argument {where} differs; "
                    f"{len(argv)} arguments, {len(exec_start)} intended)",
                    "a bug in opsctl's rendering; report it",
                )
        elif directive.value != value:
            raise SystemdSyntaxError(
                f"{what}: systemd would read a different {directive.section}.{directive.key}=",
                "a bug in opsctl's rendering; report it",
            )


def check_env_file(text: str, expected: list[tuple[str, str]], what: str) -> None:
    """systemd would set exactly the `expected` variables, in order, from `text`. No value is ever shown."""
    got = parse_env_file(text)
    if got == expected:
        return
    names = [k for k, _ in got]
    want = [k for k, _ in expected]
    if names != want:
        extra = next((k for k in names if k not in want), None)
        detail = f"an unexpected variable {extra}" if extra and _ENV_NAME.fullmatch(extra) else "other variables"
    else:
        detail = f"a different value of {next(k for (k, a), (_, b) in zip(got, expected, strict=True) if a != b)}"
    raise SystemdSyntaxError(f"{what}: systemd would set {detail}", "a bug in opsctl's rendering; report it")


# --- systemctl: commands and the unit's state ----------------------------------------------------------------

SHOW_PROPS = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ActiveEnterTimestamp")


@dataclass(frozen=True)
class UnitState:
    load_state: str
    active_state: str  # active | activating | deactivating | inactive | failed | reloading
    sub_state: str  # running | auto-restart | dead | ...
    result: str  # success | exit-code | signal | start-limit-hit | ...
    n_restarts: int
    main_pid: int
    active_enter: str  # ActiveEnterTimestamp, as systemd prints it ("" when never active)

    @property
    def running(self) -> bool:
        return self.active_state == "active" and self.sub_state == "running"

    def describe(self) -> str:
        return f"{self.active_state}/{self.sub_state} (result {self.result}, NRestarts {self.n_restarts})"


def show_cmd(unit: str) -> Cmd:
    return Cmd.of("systemctl", "show", "-p", ",".join(SHOW_PROPS), "--", unit)


def parse_show(stdout: str) -> UnitState:
    """`systemctl show -p ...` output (KEY=VALUE lines)."""
    values = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    if "ActiveState" not in values:
        raise DeployError(f"unexpected `systemctl show` output: {stdout.strip()[:200]!r}")

    def _int(key: str) -> int:
        try:
            return int(values.get(key, "0") or 0)
        except ValueError:
            return 0

    return UnitState(
        load_state=values.get("LoadState", ""),
        active_state=values["ActiveState"],
        sub_state=values.get("SubState", ""),
        result=values.get("Result", ""),
        n_restarts=_int("NRestarts"),
        main_pid=_int("MainPID"),
        active_enter=values.get("ActiveEnterTimestamp", ""),
    )


def daemon_reload_cmd() -> Cmd:
    return Cmd.of("systemctl", "daemon-reload", sudo=True)


def enable_cmd(unit: str) -> Cmd:
    return Cmd.of("systemctl", "enable", "--quiet", "--", unit, sudo=True)


def reenable_cmd(unit: str) -> Cmd:
    """Enable as the unit file says now (its [Install] section may have changed since the last enable)."""
    return Cmd.of("systemctl", "reenable", "--quiet", "--", unit, sudo=True)


def is_enabled_cmd(unit: str) -> Cmd:
    """A fact read: exit 0 when the unit is enabled."""
    return Cmd.of("systemctl", "is-enabled", "--quiet", "--", unit)


def restart_cmd(unit: str) -> Cmd:
    return Cmd.of("systemctl", "restart", "--", unit, sudo=True)


def disable_now_cmd(unit: str) -> Cmd:
    return Cmd.of("systemctl", "disable", "--now", "--quiet", "--", unit, sudo=True)


def reset_failed_cmd(unit: str) -> Cmd:
    return Cmd.of("systemctl", "reset-failed", "--", unit, sudo=True)


def verify_cmd(unit_file: str) -> Cmd:
    """`systemd-analyze verify`; 2>&1: warnings go to stderr and count as failures too (no output allowed)."""
    return sh(f"systemd-analyze verify {shlex.quote(unit_file)} 2>&1", sudo=True)


# --- journalctl ----------------------------------------------------------------------------------------------

CURSOR_PREFIX = "-- cursor: "
# The line a windowed query ends with when it cut: how many older lines of the window it left out.
LEFT_OUT_PREFIX = "-- opsctl left out: "
JOURNAL_TAIL_LINES = 30


@dataclass(frozen=True)
class JournalQuery:
    unit: str
    since: str | None = None  # journalctl --since syntax ("10 min ago", "2026-11-29 22:00")
    lines: int | None = 200  # the latest N (matching) lines; None = all
    grep: str | None = None  # extended regex, applied on the host (grep -E)
    cursor: str | None = None  # continue after this cursor (follow)


@dataclass(frozen=True)
class JournalPage:
    lines: list[str]
    cursor: str | None
    left_out: int = 0  # older lines of the window (matching --grep, if any) that the line limit cut


# Keeps the window's last n lines in a ring and, when it cut, says how many it dropped; the cursor line (always
# journalctl's last) stays last. journalctl's own `-n` cannot do this beside `--since`: systemd seeks to the
# --since time and prints the first n entries after it (docs/deploy.md, "Logs and metrics").
_TAIL_AWK = (
    "index($0, c) == 1 {cur = $0; next} /^-- .* --$/ {next} {k++; ring[k % n] = $0} "
    "END {if (k > n) print p (k - n); for (i = (k > n ? k - n + 1 : 1); i <= k; i++) print ring[i % n]; "
    'if (cur != "") print cur}'
)


def journal_cmd(q: JournalQuery) -> Cmd:
    argv = ["journalctl", "-u", q.unit, "--no-pager", "-o", "short-iso", "--show-cursor"]
    if q.cursor:
        argv += ["--after-cursor", q.cursor]
    elif q.since:
        argv += ["--since", q.since]
    elif q.lines is not None:
        argv += ["-n", str(q.lines)]  # the unit's latest lines: journalctl seeks from the tail, reads only these
    windowed = q.since is not None and not q.cursor and q.lines is not None
    if not q.grep and not windowed:
        return Cmd.of(*argv, sudo=True)
    script = shlex.join(argv)
    if q.grep:
        # Filter on the host (less to transfer) but keep the cursor line; grep exits 1 on no match: not an error.
        pattern = shlex.quote(f"({q.grep})|^{CURSOR_PREFIX}")
        script += f" | {{ grep -E -- {pattern} || true; }}"
    if windowed:
        # The window's latest (matching) lines, and how many older ones were cut
        awk = ["awk", "-v", f"n={q.lines}", "-v", f"c={CURSOR_PREFIX}", "-v", f"p={LEFT_OUT_PREFIX}", _TAIL_AWK]
        script += f" | {shlex.join(awk)}"
        # pipefail: a --since journalctl cannot parse is its error, not an empty window (dash has no pipefail)
        return Cmd.of("bash", "-o", "pipefail", "-c", script, sudo=True)
    return sh(script, sudo=True)


def parse_journal_page(stdout: str) -> JournalPage:
    """Lines (without journalctl's '-- No entries --' notices), the trailing cursor and how many lines the
    window's line limit left out."""
    lines: list[str] = []
    cursor: str | None = None
    left_out = 0
    for line in stdout.splitlines():
        if line.startswith(CURSOR_PREFIX):
            cursor = line[len(CURSOR_PREFIX) :].strip()
        elif line.startswith(LEFT_OUT_PREFIX):  # ours (a journal line starts with its time)
            count = line[len(LEFT_OUT_PREFIX) :].strip()
            left_out = int(count) if count.isdigit() else 0
        elif line.startswith("-- ") and line.endswith(" --"):
            continue  # "-- No entries --", "-- Boot ... --"
        elif line:
            lines.append(line)
    return JournalPage(lines, cursor, left_out)


def parse_journal(stdout: str) -> tuple[list[str], str | None]:
    """Lines (without journalctl's '-- No entries --' notices) and the trailing cursor."""
    page = parse_journal_page(stdout)
    return page.lines, page.cursor


def journal_tail_cmd(unit: str, lines: int = JOURNAL_TAIL_LINES) -> Cmd:
    """The unit's last lines, message only (what a failed deploy prints)."""
    return Cmd.of("journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat", sudo=True)


def ddtree_lines_cmd(unit: str) -> Cmd:
    """The unit's last DDTREE init/metrics lines (what `opsctl status` summarises)."""
    return sh(
        f"journalctl -u {unit} --no-pager -o cat -n 20000 | grep -E 'DDTREE (init|metrics) ' | tail -n 50 || true",
        sudo=True,
    )
