"""The offline wheelhouse: built once per lock (stamped), reused, user directories used as given."""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from opsctl import pip_index, progress, wheelhouse
from opsctl.kernel.locks import Lock, Profile
from opsctl.pip_index import Choice, PipIndexes
from tests.conftest import REPO

LOCK = Lock(Profile.REFERENCE, "reference-cpu.txt", "torch==2.13.0\nuvicorn>=0.29\n")


FAKE_PIP = (sys.executable, str(REPO / "tests/fixtures/bin/fake_pip.py"))
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
UVICORN = "uvicorn-0.54.0-py3-none-any.whl"


def reachable(text: str) -> Choice:
    return Choice(text)


def ensure(lock: Lock, target: Path, lines: list[str] | None = None, **kwargs: Any) -> wheelhouse.Wheelhouse:
    sink = lines if lines is not None else []
    return wheelhouse.ensure(lock, target, pip=FAKE_PIP, indexes=kwargs.pop("indexes", reachable), out=sink.append)


def fake_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wheels: list[str], **env: str) -> Path:
    log = tmp_path / "fake-pip.json"
    monkeypatch.setenv("FAKE_PIP_WHEELS", ",".join(wheels))
    monkeypatch.setenv("FAKE_PIP_LOG", str(log))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return log


def test_build_then_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_pip(monkeypatch, tmp_path, [TORCH, UVICORN])
    target = tmp_path / "wh"
    built = ensure(LOCK, target)
    assert built.built and built.files == tuple(sorted([TORCH, UVICORN]))
    argv = json.loads(log.read_text())["argv"]
    assert argv[:6] == ["download", "--only-binary=:all:", "--progress-bar", "raw", "--dest", str(target) + ".partial"]
    assert (target / "requirements.txt").read_text() == LOCK.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [".wh.lock", "fake-pip.json", "wh"]  # no staging dir
    log.unlink()
    again = ensure(LOCK, target)
    assert not again.built and not log.exists()  # stamp matches: no download
    changed = Lock(Profile.REFERENCE, "reference-cpu.txt", LOCK.text + "rich\n")
    assert ensure(changed, target).built and log.exists()  # lock changed: rebuilt


def test_a_stray_wheel_invalidates_the_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pip(monkeypatch, tmp_path, [UVICORN])
    target = tmp_path / "wh"
    ensure(LOCK, target)
    (target / "other-1.0-py3-none-any.whl").write_bytes(b"x")
    assert not wheelhouse.stamp_matches(target, LOCK)


def test_user_directory_without_stamp_is_used_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"x")
    got = ensure(LOCK, tmp_path)
    assert (got.built, got.files) == (False, ("a-1.0-py3-none-any.whl",))
    assert wheelhouse.given(tmp_path).files == ("a-1.0-py3-none-any.whl",)
    with pytest.raises(wheelhouse.WheelhouseError, match=r"no \.whl files"):
        wheelhouse.given(tmp_path / "missing")


def test_download_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pip(monkeypatch, tmp_path, [], FAKE_PIP_FAIL="1")
    with pytest.raises(wheelhouse.WheelhouseError) as info:
        ensure(LOCK, tmp_path / "wh")
    assert info.value.message == (
        "pip download for reference-cpu.txt failed: ERROR: No matching distribution found for torch==2.13.0"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".wh.lock", "fake-pip.json"]  # no target, no staging


def test_a_slow_download_shows_progress_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake pip taking about 1.2 s per wheel, progress every 0.3 s: lines name the file and its bytes."""
    fake_pip(monkeypatch, tmp_path, [TORCH, UVICORN], FAKE_PIP_DELAY="1.2")
    lines: list[str] = []
    monkeypatch.setattr(wheelhouse, "Ticker", functools.partial(wheelhouse.Ticker, every=0.3))
    ensure(LOCK, tmp_path / "wh", lines)
    assert any(re.fullmatch(rf"wheelhouse reference-cpu.txt: 0 files saved; {re.escape(TORCH)}: "
                            r"[1-4]\.0 MB of 4\.0 MB \(\d+s\)", ln) for ln in lines), lines  # fmt: skip
    assert any(f"1 files saved; {UVICORN}" in ln for ln in lines), lines
    assert re.fullmatch(r"wheelhouse reference-cpu.txt: done after \d+s", lines[-1]), lines


def test_a_quick_download_says_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "EVERY_S", 3600.0)  # quick whatever the load: no ticker lines (tested apart)
    fake_pip(monkeypatch, tmp_path, [UVICORN])
    lines: list[str] = []
    ensure(LOCK, tmp_path / "wh", lines)
    assert lines == []


def test_observe_pip_output() -> None:
    state = wheelhouse.DownloadState()
    feed = [
        "Collecting torch==2.13.0 (from -r r.txt (line 5))",
        "  Downloading https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl (190.2 MB)",
        "Progress 1048576 of 190200000",
    ]
    assert [wheelhouse.observe(state, line) for line in feed] == [False, True, True]
    assert state.detail() == "0 files saved; torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl: 1.0 MB of 190.2 MB"
    assert wheelhouse.observe(state, "Saved /x/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl")
    assert wheelhouse.observe(state, "  File was already downloaded /x/numpy-2.4.6-cp311-cp311-linux_x86_64.whl")
    assert wheelhouse.observe(state, "  Downloading uvicorn-0.54.0-py3-none-any.whl (64 kB)")
    assert state.detail() == "2 files saved; uvicorn-0.54.0-py3-none-any.whl (64 kB)"
    assert not wheelhouse.observe(state, "Looking in indexes: https://pypi.org/simple")


def test_unreachable_indexes_are_skipped_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "EVERY_S", 3600.0)  # no "waiting (2s)" lines from a loaded machine's slow fake pip
    log = fake_pip(monkeypatch, tmp_path, [UVICORN])
    lock = Lock(Profile.REFERENCE, "reference-cpu.txt", "--extra-index-url http://10.9.9.9/cpu\nuvicorn\n")
    config = PipIndexes(index_url="http://mirror.lab/simple")

    def decide(text: str) -> Choice:
        return pip_index.choose(text, config, {"http://10.9.9.9/cpu": "no answer within 3s"})

    lines: list[str] = []
    ensure(lock, tmp_path / "wh", lines, indexes=decide)
    assert lines == ["wheelhouse reference-cpu.txt: skipping package index http://10.9.9.9/cpu: unreachable "
                     "(no answer within 3s)"]  # fmt: skip
    seen = json.loads(log.read_text())
    assert seen["requirements"] == "uvicorn\n"
    assert (seen["env"]["PIP_INDEX_URL"], seen["env"]["PIP_EXTRA_INDEX_URL"]) == ("http://mirror.lab/simple", "")
    assert (tmp_path / "wh/requirements.txt").read_text() == lock.text  # the lock itself is kept whole


def test_no_reachable_index_is_one_line_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_pip(monkeypatch, tmp_path, [UVICORN])

    def decide(text: str) -> Choice:
        return pip_index.choose(text, PipIndexes(), {pip_index.PYPI: "connection refused"})

    with pytest.raises(wheelhouse.WheelhouseError) as info:
        ensure(LOCK, tmp_path / "wh", indexes=decide)
    assert info.value.one_line() == (
        "wheelhouse for reference-cpu.txt: no package index is reachable: https://pypi.org/simple (connection "
        "refused) (fix the control machine's pip configuration (pip config list), or pass --wheelhouse DIR)"
    )
    assert not log.exists() and not (tmp_path / "wh.partial").exists()


def test_a_download_another_caller_runs_is_waited_for_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two callers on one directory (two test runs sharing wheelhouse.CACHE_DIR): the second waits on the lock,
    then reuses what the first built; it never downloads into the staging dir the first one is filling."""
    import fcntl
    import threading

    log = fake_pip(monkeypatch, tmp_path, [TORCH, UVICORN])
    target = tmp_path / "wh"
    lines: list[str] = []
    waiting = threading.Event()
    got: list[wheelhouse.Wheelhouse] = []

    def say(line: str) -> None:
        lines.append(line)
        if "waiting for another download" in line:
            waiting.set()

    def second() -> None:
        got.append(wheelhouse.ensure(LOCK, target, pip=FAKE_PIP, indexes=reachable, out=say))

    with (tmp_path / ".wh.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        caller = threading.Thread(target=second)
        caller.start()
        assert waiting.wait(timeout=30), lines
        wheelhouse._build(LOCK, target, FAKE_PIP, reachable, lambda _: None)  # what the holder does
        log.unlink()
    caller.join(timeout=30)
    assert len(got) == 1 and not got[0].built and got[0].files == tuple(sorted([TORCH, UVICORN]))
    assert not log.exists()  # the waiter ran no pip download of its own
    assert lines == [f"wheelhouse reference-cpu.txt: waiting for another download into {target}"]
