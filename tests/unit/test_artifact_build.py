"""opsctl.artifact's build of the runtime wheel from source, on a small package of the same name (a real pip
build, seconds): parallel builds of one tree, a tree left clean, a hash that sees every source file."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opsctl import artifact, runtime_build

PYPROJECT = """[build-system]
requires = ["setuptools>=68", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "ddtree-runtime"
version = "0.0.1"

[tool.setuptools.packages.find]
include = ["ddtree*"]
"""


@pytest.fixture()
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the wheel cache lives under ~/.cache
    src = tmp_path / "runtime"
    (src / "ddtree" / "tiny").mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "ddtree" / "__init__.py").write_text("")
    (src / "ddtree" / "tiny" / "__init__.py").write_text("")
    (src / "ddtree" / "tiny" / "distill.py").write_text("STEPS = 1\n")
    return src


def test_parallel_builds_of_one_tree_all_succeed_and_leave_it_clean(source: Path) -> None:
    with ThreadPoolExecutor(3) as pool:
        wheels = list(pool.map(lambda _: artifact.runtime_wheel(src=source), range(3)))
    assert len({w.sha256 for w in wheels}) == 1 and wheels[0].name.startswith("ddtree_runtime-0.0.1-")
    left = sorted(p.name for p in source.iterdir())
    assert left == ["ddtree", "pyproject.toml"], left  # no build/ or *.egg-info written into the sources


def test_the_source_hash_sees_files_whose_names_hold_build_or_dist(source: Path) -> None:
    before = runtime_build.source_hash(source)
    (source / "build").mkdir()
    (source / "build" / "junk.py").write_text("x = 1\n")
    (source / "ddtree_runtime.egg-info").mkdir()
    (source / "ddtree_runtime.egg-info" / "PKG-INFO").write_text("junk\n")
    assert runtime_build.source_hash(source) == before  # build outputs do not count
    (source / "ddtree" / "tiny" / "distill.py").write_text("STEPS = 2\n")
    assert runtime_build.source_hash(source) != before  # distill.py is a source (it holds "dist")
