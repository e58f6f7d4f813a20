"""The one tiny-model cache of a test run: `python -m ddtree.tiny` builds, once per arch, under a lock.

The root is DDTREE_TINY_CACHE when set; else, as root, /var/cache/opsctl/tiny (where `opsctl lab up` keeps the
lab's tiny qwen3, so the lab tier and the runtime tiers share one build); else <repo>/.cache/tiny (git-ignored).
A file lock per arch (<root>/.<arch>.lock, the one opsctl.lab.models takes too) keeps parallel test runs and
tiers from building the same model twice; the build runs in a subprocess (its own thread settings and memory)
and lands by rename, so a reader never sees a half-written directory. A cache whose build.json carries another
BUILD_VERSION is rebuilt.

`python tests/runtime/tiny_cache.py ARCH...` builds the given archs in order (scripts/check starts it first, in
the background, so no tier waits on a build it would otherwise start itself).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_ROOT = Path("/var/cache/opsctl/tiny")  # opsctl.lab.inventory.TINY_DIR


def cache_root() -> Path:
    explicit = os.environ.get("DDTREE_TINY_CACHE")
    if explicit:
        return Path(explicit)
    return SHARED_ROOT if os.geteuid() == 0 else REPO / ".cache" / "tiny"


def _is_current(model_dir: Path, version: int) -> bool:
    report = model_dir / "build.json"
    if not report.is_file():
        return False
    try:
        return bool(json.loads(report.read_text()).get("build_version") == version)
    except ValueError:
        return False


class TinySeedError(ValueError):
    pass


def build_seed() -> int:
    """DDTREE_TINY_SEED: the seed the tiny models are built from (0 unless set)."""
    raw = os.environ.get("DDTREE_TINY_SEED", "0")
    if not raw.isascii() or not raw.isdecimal() or len(raw) > 6:
        raise TinySeedError(f"DDTREE_TINY_SEED must be a small non-negative integer, got {raw[:20]!r}")
    return int(raw)


def model_dir_of(arch: str, root: Path, seed: int) -> Path:
    return root / arch if seed == 0 else root / f"seed-{seed}" / arch


def ensure_tiny(arch: str, root: Path | None = None) -> Path:
    """Return the cached tiny model directory for `arch`, building it (once, under a lock) if missing."""
    from ddtree.tiny_version import BUILD_VERSION  # no torch: the build itself runs in a subprocess

    root = cache_root() if root is None else root
    seed = build_seed()
    model_dir = model_dir_of(arch, root, seed)
    if _is_current(model_dir, BUILD_VERSION):
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with (model_dir.parent / f".{arch}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not _is_current(model_dir, BUILD_VERSION):
            cmd = [
                sys.executable,
                "-m",
                "ddtree.tiny",
                "--arch",
                arch,
                "--out",
                str(model_dir),
                "--seed",
                str(seed),
                "--force",
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return model_dir


def main(archs: list[str]) -> int:
    for arch in archs:
        try:
            print(f"tiny_cache: {arch}: {ensure_tiny(arch)}", file=sys.stderr)
        except (RuntimeError, TinySeedError) as exc:
            print(f"tiny_cache: {arch}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
