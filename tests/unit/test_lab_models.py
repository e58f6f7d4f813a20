"""The lab's tiny-model cache: reuse a complete build, report a failed one in one line."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

from opsctl.errors import LabError
from opsctl.lab import models
from opsctl.lab.models import ensure_tiny_models
from tests.conftest import REPO


def test_complete_build_is_reused(tmp_path: Path) -> None:
    for part in ("target", "draft"):
        (tmp_path / "qwen3" / part).mkdir(parents=True)
        (tmp_path / "qwen3" / part / "config.json").write_text("{}")
    # the version `lab up` compares with (ddtree.tiny re-exports it, at the cost of a torch import: 17 s)
    from ddtree.tiny_version import BUILD_VERSION

    (tmp_path / "qwen3" / "build.json").write_text(f'{{"build_version": {BUILD_VERSION}}}')
    assert ensure_tiny_models(tmp_path, "qwen3") is False


# A builder that says how it was called and fails: the real one imports torch before it reads its arguments
# (18 s a run); test_failed_build_is_one_line runs that one.
ECHO_BUILD = (sys.executable, "-c", "import sys; print('builder ran:', *sys.argv[1:]); sys.exit(3)")


@pytest.mark.parametrize("record", [None, '{"build_version": -1}', "not json"])
def test_stale_build_is_rebuilt(tmp_path: Path, record: str | None) -> None:
    """A cache from an older builder (no build.json, another build_version, an unreadable one) is built again,
    replacing what is there (--force)."""
    for part in ("target", "draft"):
        (tmp_path / "qwen3" / part).mkdir(parents=True)
        (tmp_path / "qwen3" / part / "config.json").write_text("{}")
    if record is not None:
        (tmp_path / "qwen3" / "build.json").write_text(record)
    with pytest.raises(LabError) as info:
        ensure_tiny_models(tmp_path, "qwen3", builder=ECHO_BUILD, progress=lambda _: None)
    ran = f"builder ran: --arch qwen3 --out {tmp_path / 'qwen3'} --force"
    assert info.value.message == f"building the lab's tiny models failed: {ran}"


def test_failed_build_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LabError, match=r"building the lab.s tiny models failed: .*invalid choice") as info:
        ensure_tiny_models(tmp_path, "no-such-arch")
    assert "\n" not in info.value.one_line()


SLOW_BUILD = (sys.executable, str(REPO / "tests/fixtures/bin/fake_slow_build.py"))


def test_a_slow_build_shows_its_steps_and_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake builder that logs a step every 0.4 s, progress every 0.5 s: the lines carry the step and the loss,
    and the build's own log format is what opsctl reads."""
    monkeypatch.setattr(models, "Ticker", functools.partial(models.Ticker, every=0.5))
    lines: list[str] = []
    assert ensure_tiny_models(tmp_path, "qwen3", builder=SLOW_BUILD, progress=lines.append) is True
    steps = [
        ln
        for ln in lines
        if re.fullmatch(r"tiny qwen3 models \(once\): target step \d+/100, loss \d\.\d{3} \(\d+s\)", ln)
    ]
    assert len(steps) >= 2, lines
    assert re.fullmatch(r"tiny qwen3 models \(once\): done after \d+s", lines[-1]), lines


def test_a_failed_slow_build_ends_with_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "Ticker", functools.partial(models.Ticker, every=0.5))
    monkeypatch.setenv("FAKE_EXIT", "1")
    lines: list[str] = []
    with pytest.raises(LabError, match="tiny models failed: some other line"):
        ensure_tiny_models(tmp_path, "qwen3", builder=SLOW_BUILD, progress=lines.append)
    assert re.fullmatch(r"tiny qwen3 models \(once\): failed after \d+s", lines[-1]), lines


def _complete(out: Path) -> None:
    from ddtree.tiny_version import BUILD_VERSION

    for part in ("target", "draft"):
        (out / part).mkdir(parents=True)
        (out / part / "config.json").write_text("{}")
    (out / "build.json").write_text(f'{{"build_version": {BUILD_VERSION}}}')


def test_a_build_another_process_holds_is_waited_for_not_repeated(tmp_path: Path) -> None:
    """The per-arch lock (the one tests/runtime/tiny_cache.py takes): a caller that finds it held waits, then
    uses what the holder built; its own builder (here one that fails) never runs."""
    import fcntl
    import threading

    lines: list[str] = []
    waiting = threading.Event()
    result: list[bool] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "waiting for the build" in line:
            waiting.set()

    failing = (sys.executable, "-c", "raise SystemExit('must not build')")
    with (tmp_path / ".qwen3.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        caller = threading.Thread(
            target=lambda: result.append(ensure_tiny_models(tmp_path, "qwen3", builder=failing, progress=progress))
        )
        caller.start()
        assert waiting.wait(timeout=30), lines
        _complete(tmp_path / "qwen3")
    caller.join(timeout=30)
    assert result == [False], lines
    assert lines == ["tiny qwen3 models: waiting for the build another process runs"]
