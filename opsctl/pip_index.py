"""Which package indexes a wheelhouse download may use: the control machine's pip configuration plus the
lock's own index lines, each probed first with a short timeout.

pip waits on an unreachable index for minutes without a word (timeouts times retries). So before `pip download`
every index it would use is probed (an HTTP request, `PROBE_TIMEOUT_S`, all at once):
- an unreachable extra index (the lock's `--extra-index-url`, or one from pip's configuration) is dropped,
  and a line says which one and why;
- an unreachable main index is replaced by the first reachable extra one;
- when nothing is reachable and pip has no `find-links`, the download stops with one line, in seconds.
The control machine's pip configuration (files and PIP_* variables: certificates, constraints, proxies,
find-links) stays in force: only the index settings are narrowed, through PIP_INDEX_URL/PIP_EXTRA_INDEX_URL.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

PYPI = "https://pypi.org/simple"
PROBE_TIMEOUT_S = 3.0

# `pip config list` scopes, lowest precedence first (a later scope overrides an earlier one for one key).
_SCOPES = ("global", "download", ":env:")


@dataclass(frozen=True)
class PipIndexes:
    """The index settings pip would use for `pip download`."""

    index_url: str = PYPI
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False


def parse_config_list(text: str) -> PipIndexes:
    """`pip config list` output (`global.index-url='...'`, `:env:.extra-index-url='a b'`) -> PipIndexes."""
    values: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        scope, dot, name = key.strip().rpartition(".")
        if not sep or not dot or scope not in _SCOPES:
            continue
        try:
            parts = shlex.split(raw)
        except ValueError:
            continue
        values.setdefault(name, {})[scope] = " ".join(parts)

    def pick(name: str) -> str | None:
        scoped = values.get(name, {})
        found = [scoped[s] for s in _SCOPES if s in scoped]
        return found[-1] if found else None

    no_index = (pick("no-index") or "").lower() in ("1", "true", "yes", "on")
    return PipIndexes(
        index_url=pick("index-url") or PYPI,
        extra_index_urls=tuple((pick("extra-index-url") or "").split()),
        find_links=tuple((pick("find-links") or "").split()),
        no_index=no_index,
    )


def read_pip_config(python: str = sys.executable) -> PipIndexes:
    """The control machine's pip index settings, as pip itself resolves files and PIP_* variables."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return PipIndexes()
    return parse_config_list(proc.stdout) if proc.returncode == 0 else PipIndexes()


@dataclass(frozen=True)
class LockIndexes:
    """The index options a lock file carries, and its text without them."""

    index_url: str | None
    extra_index_urls: tuple[str, ...]
    body: tuple[str, ...]  # the other lines, unchanged


_INDEX_OPTS = {"--index-url": "index", "-i": "index", "--extra-index-url": "extra"}


def parse_lock(text: str) -> LockIndexes:
    index: str | None = None
    extras: list[str] = []
    body: list[str] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        opt, _, inline = words[0].partition("=") if words else ("", "", "")
        kind = _INDEX_OPTS.get(opt)
        url = inline or (words[1] if len(words) > 1 else "")
        if kind is None or not url:
            body.append(line)
        elif kind == "index":
            index = url
        else:
            extras.append(url)
    return LockIndexes(index, tuple(extras), tuple(body))


def shown(url: str) -> str:
    """An index URL fit to print: user and password removed."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the index answers (any HTTP status: the server is there), else why not, in a few words."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return None if Path(parts.path).is_dir() else f"{parts.path} is not a directory"
    if parts.scheme not in ("http", "https"):
        return None if Path(url).is_dir() else f"{url} is not a directory"
    try:
        with httpx.Client(timeout=timeout, trust_env=True, follow_redirects=False) as client:
            client.head(url)
    except httpx.TimeoutException:
        return f"no answer within {timeout:g}s"
    except httpx.HTTPError as exc:
        reason = str(exc).strip().splitlines()
        return reason[-1][:120] if reason and reason[-1] else type(exc).__name__
    return None


def probe_all(urls: Iterable[str], timeout: float = PROBE_TIMEOUT_S) -> dict[str, str | None]:
    """Every URL probed at once, so the whole check takes one timeout at most."""
    unique = list(dict.fromkeys(urls))
    if not unique:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(unique))) as pool:
        return dict(zip(unique, pool.map(lambda u: probe(u, timeout), unique), strict=True))


@dataclass(frozen=True)
class Choice:
    """What `pip download` gets: the requirements text and PIP_* overrides; what was skipped and why."""

    requirements: str
    env: Mapping[str, str] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()  # (url, why)
    error: str | None = None  # nothing to download from

    def notes(self) -> list[str]:
        return [f"skipping package index {shown(url)}: unreachable ({why})" for url, why in self.skipped]


def choose(lock_text: str, config: PipIndexes, reachable: Mapping[str, str | None]) -> Choice:
    """The pure decision. `reachable[url]` is None for a reachable index, else the reason it is not."""
    lock = parse_lock(lock_text)
    if config.no_index:
        return Choice("\n".join(lock.body) + "\n")
    main = lock.index_url or config.index_url
    extras = list(dict.fromkeys((*config.extra_index_urls, *lock.extra_index_urls)))
    skipped = [(u, why) for u in (main, *extras) if (why := reachable.get(u)) is not None]
    down = {u for u, _ in skipped}
    alive = [u for u in (main, *extras) if u not in down]
    body = "\n".join(lock.body) + "\n"
    if not alive and not config.find_links:
        first = skipped[0]
        return Choice(
            body, skipped=tuple(skipped),
            error=f"no package index is reachable: {shown(first[0])} ({first[1]})"
            + (f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""),
        )  # fmt: skip
    if not skipped:
        return Choice(lock_text)
    env: dict[str, str] = {}
    if not alive:
        env["PIP_NO_INDEX"] = "1"  # find-links only
    else:
        env["PIP_INDEX_URL"] = alive[0]
        env["PIP_EXTRA_INDEX_URL"] = " ".join(alive[1:])
    return Choice(body, env, tuple(skipped))


def decide(
    lock_text: str,
    config: PipIndexes | None = None,
    prober: Callable[[Iterable[str]], Mapping[str, str | None]] = probe_all,
) -> Choice:
    """Read pip's configuration (unless given), probe every index it and the lock name, decide."""
    config = config if config is not None else read_pip_config()
    if config.no_index:
        return choose(lock_text, config, {})
    lock = parse_lock(lock_text)
    urls = [lock.index_url or config.index_url, *config.extra_index_urls, *lock.extra_index_urls]
    return choose(lock_text, config, prober(urls))


def child_env(choice: Choice) -> dict[str, str]:
    """The environment for `pip download`: ours, with the narrowed index settings."""
    return {**os.environ, **choice.env}  # an empty PIP_EXTRA_INDEX_URL means none (pip splits it to [])
