"""What each kind of string in an inventory may contain, and how a value may be shown in a message.

Every string that reaches a host (a unit, an EnvironmentFile, argv, a shell command, apt or pip) is one of the
kinds below and is checked by `check` with a full match (`re.fullmatch`, so a trailing newline never slips
past `$`). None of the kinds admits a control character, and none that a program could read as an option
starts with `-`. docs/inventory.md lists the kinds and the limits; keep the two in step.

Messages show user text only through `excerpt`: escaped (no control characters, no terminal escapes, no
non-ASCII), at most EXCERPT_MAX characters, with token-shaped literals and secret flag values masked.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum

from opsctl.errors import InventoryError


class Kind(StrEnum):
    NAME = "safe name"  # host and service names: used in unit names, paths and journald identifiers
    USER = "valid user name"  # SSH login name
    HOST_PATH = "safe absolute path"  # an absolute path on a host
    CONTROL_PATH = "safe path"  # a path on the control machine (may be relative or start with ~/)
    ADDRESS = "valid IP address or hostname"  # an IP address (v4 or v6) or a DNS name
    JUMP_HOST = "valid jump host"  # [user@]host[:port]
    COMMAND = "safe command"  # an interpreter name or path (the host's python)
    PACKAGE = "valid package name"  # a Debian package name (apt-get)
    VERSION = "exact version"  # an exact Python package version (pip pin)
    ARG = "safe argument"  # one extra server argument (argv)
    WORD = "safe word"  # a single server flag value (served model name, attention backend)
    ENV_NAME = "valid environment variable name"  # an environment variable name
    ENV_VALUE = "safe environment value"  # an environment variable value
    PROMPT = "prompt"  # a chat message opsctl sends in a JSON body (smoke_prompt); never in argv or files


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    max_len: int
    says: str  # what the kind may contain, for messages and the docs


_SAFE = r"A-Za-z0-9._/+@-"  # characters that are safe in unit lines, env files, shells and argv unquoted
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"

RULES: dict[Kind, Rule] = {
    Kind.NAME: Rule(re.compile(r"[a-z0-9][a-z0-9_-]{0,39}"), 40, "lowercase letters, digits, '-', '_'; at most 40"),
    Kind.USER: Rule(re.compile(r"[a-z_][a-z0-9_-]{0,31}"), 32, "lowercase letters, digits, '-', '_'"),
    Kind.HOST_PATH: Rule(
        re.compile(rf"/[{_SAFE}]{{0,1023}}"), 1024, "starting with /; letters, digits and . _ / + @ -"
    ),
    Kind.CONTROL_PATH: Rule(
        re.compile(r"(?:~/|[A-Za-z0-9._/+@])[A-Za-z0-9._/+@-]{0,1022}"),
        1024,
        "letters, digits and . _ / + @ -; may start with ~/, not with -",
    ),
    Kind.ADDRESS: Rule(
        re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*\.?|[0-9A-Fa-f:.]{{2,45}}"),
        253,
        "an IPv4 or IPv6 address or a DNS name",
    ),
    Kind.JUMP_HOST: Rule(
        re.compile(rf"(?:[a-z_][a-z0-9_-]{{0,31}}@)?{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?"),
        300,
        "[user@]host[:port]",
    ),
    Kind.COMMAND: Rule(
        re.compile(rf"[A-Za-z0-9/][{_SAFE}]{{0,255}}"),
        256,
        "a command name or absolute path: letters, digits and . _ / + @ -",
    ),
    Kind.PACKAGE: Rule(
        re.compile(r"[a-z0-9][a-z0-9+.-]{1,127}"), 128, "lowercase letters, digits and + . -, not starting with -"
    ),
    Kind.VERSION: Rule(
        re.compile(r"[0-9]+(?:\.[0-9]+){0,4}(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"),
        64,
        "an exact version like 0.5.23",
    ),
    Kind.ARG: Rule(re.compile(r"[A-Za-z0-9._/+@=:,-]{1,512}"), 512, "letters, digits and . _ = : / , + @ -"),
    Kind.WORD: Rule(
        re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+@:-]{0,255}"),
        256,
        "letters, digits and . _ / + @ - : (not starting with - . / + @)",
    ),
    Kind.ENV_NAME: Rule(re.compile(r"[A-Z_][A-Z0-9_]{0,127}"), 128, "A-Z, 0-9 and _, not starting with a digit"),
    Kind.ENV_VALUE: Rule(
        re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{0,4096}"), 4096, "one line of printable characters"
    ),
    Kind.PROMPT: Rule(re.compile(r"[ -~]{1,500}"), 500, "printable ASCII text, spaces included; at most 500"),
}

# Flags whose value is a secret, as SGLang's server parser (argparse, allow_abbrev) and opsctl's reference
# server know them. Checked on the normalised name: leading dashes stripped, `_` read as `-`, any case.
SECRET_FLAGS = ("api-key", "admin-api-key", "ssl-keyfile-password")
# Exact flags that are prefixes of a secret flag but are not secrets themselves (argparse prefers exact names).
_NOT_SECRET_EXACT = {"ssl-keyfile"}

# Literal credentials by shape. Searched inside every string and key of the inventory.
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}"  # OpenAI / Anthropic / Stripe style
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API key
    r"|(?:nvapi|pypi)-[A-Za-z0-9_-]{20,}"  # NVIDIA NGC, PyPI
    r"|(?:gsk|r8)_[A-Za-z0-9]{20,}"  # Groq, Replicate
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    r"|-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----"
    r")"
)
# For masking in messages: the same shapes anywhere, even inside a word (a false positive only hides text).
_TOKEN_ANYWHERE = re.compile(_TOKEN.pattern.removeprefix("(?<![A-Za-z0-9])"))
_SECRET_FLAG_VALUE = re.compile(r"(-{1,2}[A-Za-z_-]{1,40})=([^\s]*)")

EXCERPT_MAX = 40  # characters of a value shown in a message, quotes and escapes included (always <= 80)
SECRET_HINT = "write the secret as the service's api_key: env:NAME or file:PATH"

# The runtime's benchmark and test hooks: environment variables a service never runs with. The inventory refuses
# them (as `ddtree.*` keys and in `extra_env`) and render refuses any rendered environment that holds one.
TEST_HOOK_ENV = {
    "DDTREE_REPLAY_ACCEPTANCE": "commits recorded paths instead of the target's choices",
    "DDTREE_RECORD_ROUNDS": "records every decode round to a file",
    "DDTREE_RECORD_PATHS": "records every request's accepted paths to a file",
    "DDTREE_TEST_POLICY": "runs the shape policy on synthetic costs",
    "DDTREE_TEST_DEMOTE_SPINE": "plans every tree from the drafter's second choice",
}
TEST_HOOK_HINT = "remove it: a benchmark sets it in the environment it starts the server with, never a service"


def token_kind(text: str) -> str | None:
    """The start of a token-shaped literal in `text` (e.g. 'sk-'), or None. Never the token itself."""
    found = _TOKEN.search(text)
    if found is None:
        return None
    token = found.group(0)
    return "a private key" if token.startswith("-----") else f"a token starting {token[:3]!r}"


def secret_flag(arg: str) -> str | None:
    """The flag as written (without any value) when `arg` names a secret flag the way argparse would
    resolve it: exact, an unambiguous (or ambiguous) prefix, `=value` forms, `_` for `-`, any case."""
    flag = arg.split("=", 1)[0]
    if not flag.startswith("-"):
        return None
    name = flag.lstrip("-").replace("_", "-").lower()
    if not name or name in _NOT_SECRET_EXACT:
        return None
    return flag if any(secret.startswith(name) for secret in SECRET_FLAGS) else None


def redact(text: str) -> str:
    """`text` with token-shaped literals and the values of secret flags replaced by ***."""
    text = _TOKEN_ANYWHERE.sub("***", text)
    return _SECRET_FLAG_VALUE.sub(lambda m: f"{m.group(1)}=***" if secret_flag(m.group(1)) else m.group(0), text)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "'": "\\'"}


def excerpt(value: object, limit: int = EXCERPT_MAX) -> str:
    """A value as a message may show it: quoted, escaped to printable ASCII, secrets masked, <= limit chars."""
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    if isinstance(value, int) and value.bit_length() > 64:
        return "<a very large number>"
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"
    out = ["'"]
    size = 2
    for ch in redact(value[: limit * 4]):
        if ch in _ESCAPES:
            piece = _ESCAPES[ch]
        elif " " <= ch <= "~":
            piece = ch
        elif ord(ch) <= 0xFF:
            piece = f"\\x{ord(ch):02x}"
        elif ord(ch) <= 0xFFFF:
            piece = f"\\u{ord(ch):04x}"
        else:
            piece = f"\\U{ord(ch):08x}"
        if size + len(piece) > limit - 3:
            out.append("...")
            break
        out.append(piece)
        size += len(piece)
    out.append("'")
    return "".join(out)


def clean(text: str, limit: int = 200) -> str:
    """Free text from a third party (a YAML parser's message) made safe to print: escaped and bounded."""
    return excerpt(text, limit)[1:-1]


_VALID: set[tuple[str, Kind]] = set()  # (text, kind) pairs that passed: an inventory repeats the same values
_VALID_MAX = 50_000  # bounded: forgotten all at once when full


def check(text: str, kind: Kind, path: str) -> str:
    """`text` when it is a valid `kind`; else an InventoryError naming `path` and showing an excerpt. Each
    distinct valid (text, kind) is checked once (only passes are remembered, so every refusal is worded
    as before: the 1,100-host inventory checks the same few hundred values 28,600 times)."""
    if (text, kind) in _VALID:
        return text
    _check(text, kind, path)
    if len(_VALID) >= _VALID_MAX:
        _VALID.clear()
    _VALID.add((text, kind))
    return text


def _check(text: str, kind: Kind, path: str) -> str:
    rule = RULES[kind]
    if len(text) > rule.max_len:
        raise InventoryError(path, f"is {len(text)} characters; a {kind.value} may have at most {rule.max_len}")
    if rule.pattern.fullmatch(text) is None:
        raise InventoryError(path, f"{excerpt(text)} is not {_article(kind)} ({rule.says})")
    if kind is Kind.ADDRESS and text[0] in ":0123456789abcdefABCDEF" and not _is_name(text):
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise InventoryError(path, f"{excerpt(text)} is not a valid IP address", rule.says) from None
    if kind in (Kind.HOST_PATH, Kind.CONTROL_PATH) and ".." in text.split("/"):
        raise InventoryError(path, f"{excerpt(text)} must not contain '..'")
    return text


def _is_name(text: str) -> bool:
    """A DNS name (has a letter outside hex digits, or no ':'): 'cafe.example' is a name, 'cafe::1' an address."""
    return ":" not in text and not re.fullmatch(r"[0-9.]+", text)


def _article(kind: Kind) -> str:
    return f"{'an' if kind.value[0] in 'aeiou' else 'a'} {kind.value}"
