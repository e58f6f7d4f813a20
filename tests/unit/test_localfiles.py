"""opsctl.localfiles.write_text_atomic: concurrent writers of one file never fail and leave one whole text."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from opsctl.localfiles import state_dir, write_text_atomic


def _write_many(path: str, text: str) -> None:
    for _ in range(300):
        write_text_atomic(Path(path), text)


def test_concurrent_writers_of_one_file_never_fail(tmp_path: Path) -> None:
    """Processes writing one cache file at once (two lab parts provisioning one model source did): the fixed
    `.tmp` name made one writer's rename fail with FileNotFoundError."""
    target = tmp_path / "cache" / "manifest.json"
    texts = [str(n) * 5000 for n in range(4)]
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_write_many, args=(str(target), text)) for text in texts]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert target.read_text() in texts  # one writer's whole text
    assert [p.name for p in target.parent.iterdir()] == ["manifest.json"]  # no temporary file left


def test_the_mode_follows_the_umask_as_write_text_does(tmp_path: Path) -> None:
    """Readers other than the writer (a cache under /var/cache) keep the access Path.write_text gave them."""
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.json", "{}")
        (tmp_path / "b.json").write_text("{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == stat.S_IMODE((tmp_path / "b.json").stat().st_mode)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "trust.json"
    write_text_atomic(target, "old")

    def broken(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("opsctl.localfiles.os.replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["trust.json"]


def test_state_dir_follows_xdg_state_home_and_falls_back_when_unset_or_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert state_dir() == tmp_path / "opsctl"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in (True, False):
        if unset:
            monkeypatch.delenv("XDG_STATE_HOME")
        else:
            monkeypatch.setenv("XDG_STATE_HOME", "")
        assert state_dir() == tmp_path / "home" / ".local" / "state" / "opsctl"
