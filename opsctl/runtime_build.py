"""Build the ddtree-runtime wheel from its source tree: the one routine behind opsctl's per-source-hash cache
(`opsctl.artifact`) and the copy an opsctl wheel carries (`setup.py` loads this file by path at build time).

Standard library only: it runs inside a package build's isolated environment, where opsctl's dependencies are
absent. The build calls setuptools' PEP 517 backend directly, not pip: an isolated build environment has
setuptools but no pip.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WHEEL_GLOB = "ddtree_runtime-*.whl"


class BuildFailed(Exception):
    """The runtime's build exited non-zero or wrote no wheel; the message is the build's last output line."""


def is_build_output(relative: Path) -> bool:
    """Whether a path under runtime/ is a build's by-product (matched per path part: `ddtree/tiny/distill.py`
    and `ddtree/pairs/build.py` are sources, `build/` and `dist/` are not)."""
    return any(part in ("__pycache__", "build", "dist") or part.endswith(".egg-info") for part in relative.parts)


def source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and not is_build_output(p.relative_to(src)))


def source_hash(src: Path) -> str:
    digest = hashlib.sha256()
    for path in source_files(src):
        digest.update(str(path.relative_to(src)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_BUILD = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"


def build_wheel(src: Path, out: Path) -> Path:
    """Build the wheel of the runtime at `src` into the directory `out`; the sources stay untouched."""
    with tempfile.TemporaryDirectory() as tmp:
        # built from a private copy: setuptools writes build/ and *.egg-info into the tree it builds
        copy = Path(tmp) / "src"
        for path in source_files(src):
            (copy / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy / path.relative_to(src))
        built_dir = Path(tmp) / "out"
        built_dir.mkdir()
        proc = subprocess.run(
            [sys.executable, "-c", _BUILD, str(built_dir)], cwd=copy, capture_output=True, text=True, check=False
        )
        built = sorted(built_dir.glob(WHEEL_GLOB))
        if proc.returncode != 0 or not built:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel written"]
            raise BuildFailed(tail[0])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], out / built[0].name)
        return out / built[0].name
