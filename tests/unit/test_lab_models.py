"""The lab's tiny-model cache: reuse a complete build, report a failed one in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.errors import LabError
from opsctl.lab.models import ensure_tiny_models


def test_complete_build_is_reused(tmp_path: Path) -> None:
    for part in ("target", "draft"):
        (tmp_path / "qwen3" / part).mkdir(parents=True)
        (tmp_path / "qwen3" / part / "config.json").write_text("{}")
    from ddtree.tiny import BUILD_VERSION

    (tmp_path / "qwen3" / "build.json").write_text(f'{{"build_version": {BUILD_VERSION}}}')
    assert ensure_tiny_models(tmp_path, "qwen3") is False


def test_stale_build_is_rebuilt(tmp_path: Path) -> None:
    """A cache from an older builder (no or another build_version) is rebuilt; a bad arch shows the attempt."""
    for part in ("target", "draft"):
        (tmp_path / "no-such-arch" / part).mkdir(parents=True)
        (tmp_path / "no-such-arch" / part / "config.json").write_text("{}")
    with pytest.raises(LabError, match="tiny models failed"):
        ensure_tiny_models(tmp_path, "no-such-arch")


def test_failed_build_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LabError, match=r"building the lab.s tiny models failed: .*invalid choice") as info:
        ensure_tiny_models(tmp_path, "no-such-arch")
    assert "\n" not in info.value.one_line()
