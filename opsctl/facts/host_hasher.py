"""Runs ON THE HOST as `python3 -c <this file> ROOT`; never imported by opsctl.

Standard library only, Python >= 3.9. Prints `<sha256> <size> <path>` for every regular file under ROOT (the
manifest excepted), hashing with hashlib (OpenSSL, SHA-NI where the CPU has it: about 4x coreutils' sha256sum)
on every CPU. A file that changed while it was hashed is hashed again.
"""

from __future__ import annotations

import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor

SKIP = ".opsctl-manifest.json"
Key = tuple[int, int, int]


def stat(root: str, rel: str) -> os.stat_result | None:
    try:
        return os.stat(os.path.join(root, rel), follow_symlinks=False)
    except OSError:
        return None


def key_of(root: str, rel: str) -> Key | None:
    st = stat(root, rel)
    return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)


def hashed(root: str, rel: str) -> tuple[Key, str] | None:
    """(key, sha256) of a file that did not change while it was hashed; None otherwise."""
    before = key_of(root, rel)
    if before is None:
        return None
    digest = hashlib.sha256()
    try:
        with open(os.path.join(root, rel), "rb") as fh:
            for chunk in iter(lambda: fh.read(8 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return (before, digest.hexdigest()) if key_of(root, rel) == before else None


def regular_files(root: str) -> list[str]:
    found = []
    for top, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(top, name), root)
            st = stat(root, rel)
            if rel != SKIP and st is not None and (st.st_mode & 0o170000) == 0o100000:
                found.append(rel)
    return sorted(found)


def hash_into(pool: ThreadPoolExecutor, root: str, rels: list[str], done: dict[str, tuple[Key, str]]) -> None:
    results = list(pool.map(lambda rel: hashed(root, rel), rels))
    for i, rel in enumerate(rels):
        got = results[i]
        if got is not None:
            done[rel] = got


def main(argv: list[str]) -> int:
    root = argv[1]
    pool = ThreadPoolExecutor(max(1, os.cpu_count() or 1))
    done: dict[str, tuple[Key, str]] = {}
    if not os.path.isdir(root):
        return 0
    present = regular_files(root)
    for _ in range(5):  # a file that keeps changing is left out (the manifest comparison then fails)
        stale = [r for r in present if r not in done or key_of(root, r) != done[r][0]]
        if not stale:
            break
        for rel in stale:
            done.pop(rel, None)
        hash_into(pool, root, stale, done)
    for rel in present:
        if rel in done:
            sys.stdout.write(f"{done[rel][1]} {done[rel][0][1]} {rel}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
