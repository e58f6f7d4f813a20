"""Model manifests: size and sha256 of every file in a model directory.

The manifest is written into the model directory as `.opsctl-manifest.json` and verified on every run; the
same listing format is produced on the host by `hash_listing_cmd` and parsed by `parse_hash_listing`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import FactError
from opsctl.kernel.hashing import sha256_file
from opsctl.localfiles import write_text_atomic

MANIFEST_NAME = ".opsctl-manifest.json"


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


Stamp = tuple[int, int, int]  # (size, mtime_ns, inode) of a source file when it was hashed


@dataclass(frozen=True)
class Manifest:
    files: Mapping[str, FileEntry]  # relative path -> entry
    # The control-side source's stamps when the manifest was built (empty for a host-side or stored manifest):
    # the same stamps after a copy prove the bytes rsync sent are the ones hashed.
    stamps: Mapping[str, Stamp] = field(default_factory=dict, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_json(self) -> str:
        body = {
            "version": 1,
            "files": {p: {"size": e.size, "sha256": e.sha256} for p, e in sorted(self.files.items())},
        }
        return json.dumps(body, indent=1, sort_keys=True) + "\n"


def parse_manifest_json(text: str) -> Manifest | None:
    """Parse a stored manifest; None when absent or unreadable (it is then simply rewritten)."""
    if not text.strip():
        return None
    try:
        body = json.loads(text)
        files = {p: FileEntry(int(e["size"]), str(e["sha256"])) for p, e in body["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return Manifest(files)


HOST_HASHER = (Path(__file__).with_name("host_hasher.py")).read_text()


def _coreutils_listing(d: str) -> str:
    """The same listing with coreutils alone (a host without python3): one sha256sum per file, nproc at once."""
    per_file = (
        'for f; do printf "%s %s %s\\n" "$(sha256sum < "$f" | cut -d" " -f1)" "$(stat -c %s "$f")" "${f#./}"; done'
    )
    return (
        f"if [ -d {d} ]; then cd {d} && find . -type f ! -name {MANIFEST_NAME} -print0"
        f' | xargs -0 -r -n 1 -P "$(nproc)" sh -c {shlex.quote(per_file)} _; fi'
    )


def hash_listing_cmd(directory: str) -> Cmd:
    """A read-only command printing `<sha256> <size> <path>` per file under `directory` (nothing if absent).

    python3's hashlib on every CPU (host_hasher.py), or coreutils' sha256sum where the host has no python3."""
    d = shlex.quote(directory)
    script = (
        f"if command -v python3 >/dev/null 2>&1; then exec python3 -c {shlex.quote(HOST_HASHER)} {d}; fi; "
        + _coreutils_listing(d)
    )
    return Cmd.of("sh", "-c", script)


def size_listing_cmd(directory: str) -> Cmd:
    """A read-only command printing `<size> <path>` per regular file under `directory` (the manifest excepted)."""
    d = shlex.quote(directory)
    return Cmd.of("sh", "-c", f"cd {d} && find . -type f ! -name {MANIFEST_NAME} -printf '%s %P\\n'")


def parse_size_listing(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for line in text.splitlines():
        size, sep, path = line.partition(" ")
        if not sep or not size.isdigit() or not path:
            raise FactError(f"size listing: malformed line {line!r}")
        sizes[path] = int(size)
    return sizes


def source_stamps(root: Path, names: Iterable[str]) -> dict[str, Stamp | None]:
    """The stamps of these files under `root` now (None for a file that is gone)."""
    found: dict[str, Stamp | None] = {}
    for rel in names:
        try:
            st = (root / rel).stat()
        except OSError:
            found[rel] = None
            continue
        found[rel] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return found


def parse_hash_listing(text: str) -> dict[str, FileEntry]:
    files: dict[str, FileEntry] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(" ", 2)
        if len(parts) != 3 or len(parts[0]) != 64 or not parts[1].isdigit():
            raise FactError(f"hash listing: malformed line {line!r}")
        files[parts[2]] = FileEntry(int(parts[1]), parts[0])
    return files


def build_local_manifest(root: Path, cache_file: Path | None = None) -> Manifest:
    """Hash every regular file under `root`. With `cache_file`, reuse hashes of files whose size and mtime
    did not change (a 54 GB model is hashed once, not on every run)."""
    cache = _load_cache(cache_file)
    files: dict[str, FileEntry] = {}
    stamps: dict[str, Stamp] = {}
    new_cache: dict[str, list[object]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise FactError(
                f"{path}: symbolic links are not copied as files", "point the model source at resolved files"
            )
        if not path.is_file() or rel == MANIFEST_NAME:
            continue
        if "\n" in rel:
            raise FactError(f"{root}: file name with a newline: {rel!r}")
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = cache.get(rel)
        if cached is not None and cached[:3] == key and isinstance(cached[3], str):
            digest = cached[3]
        else:
            digest = sha256_file(path)
        files[rel] = FileEntry(st.st_size, digest)
        stamps[rel] = (st.st_size, st.st_mtime_ns, st.st_ino)
        new_cache[rel] = [*key, digest]
    if cache_file is not None:  # two provisions of one source may write it at once
        write_text_atomic(cache_file, json.dumps(new_cache))
    return Manifest(files, stamps)


def _load_cache(cache_file: Path | None) -> dict[str, list[object]]:
    if cache_file is None or not cache_file.exists():
        return {}
    try:
        data = json.loads(cache_file.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class DirState:
    """How a directory on the host compares to the manifest."""

    good: frozenset[str]  # present with the right size and sha256
    bad: frozenset[str]  # present with a wrong size or sha256 (corrupted or stale)
    missing: frozenset[str]  # in the manifest, absent here
    extra: frozenset[str]  # here, not in the manifest

    @property
    def matches(self) -> bool:
        return not (self.bad or self.missing or self.extra)


def compare(manifest: Manifest, found: Mapping[str, FileEntry]) -> DirState:
    good = {p for p, e in found.items() if manifest.files.get(p) == e}
    bad = {p for p in found if p in manifest.files and p not in good}
    missing = set(manifest.files) - set(found)
    extra = set(found) - set(manifest.files)
    return DirState(frozenset(good), frozenset(bad), frozenset(missing), frozenset(extra))
