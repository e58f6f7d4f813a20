"""The offline wheelhouse: built once per lock (stamped), reused, user directories used as given."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from opsctl import wheelhouse
from opsctl.ops.locks import Lock, Profile

LOCK = Lock(Profile.REFERENCE, "reference-cpu.txt", "torch==2.13.0\nuvicorn>=0.29\n")


class FakePip:
    """Stands in for `pip download`: writes the wheels it would have downloaded."""

    def __init__(self, wheels: list[str], returncode: int = 0) -> None:
        self.wheels = wheels
        self.returncode = returncode
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        for name in self.wheels:
            (dest / name).write_bytes(b"wheel")
        err = "ERROR: No matching distribution found for torch==2.13.0\n" if self.returncode else ""
        return subprocess.CompletedProcess(cmd, self.returncode, "", err)


def test_build_then_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip = FakePip(["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "uvicorn-0.54.0-py3-none-any.whl"])
    monkeypatch.setattr(wheelhouse.subprocess, "run", pip)
    target = tmp_path / "wh"
    built = wheelhouse.ensure(LOCK, target)
    assert built.built and built.files == tuple(sorted(pip.wheels))
    cmd = pip.calls[0]
    assert cmd[1:6] == ["-m", "pip", "download", "--only-binary=:all:", "--dest"]
    assert (target / "requirements.txt").read_text() == LOCK.text
    assert not (tmp_path / "wh.partial").exists()
    again = wheelhouse.ensure(LOCK, target)
    assert not again.built and len(pip.calls) == 1  # stamp matches: no download
    changed = Lock(Profile.REFERENCE, "reference-cpu.txt", LOCK.text + "rich\n")
    assert wheelhouse.ensure(changed, target).built and len(pip.calls) == 2  # lock changed: rebuilt


def test_a_stray_wheel_invalidates_the_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip = FakePip(["uvicorn-0.54.0-py3-none-any.whl"])
    monkeypatch.setattr(wheelhouse.subprocess, "run", pip)
    target = tmp_path / "wh"
    wheelhouse.ensure(LOCK, target)
    (target / "other-1.0-py3-none-any.whl").write_bytes(b"x")
    assert not wheelhouse.stamp_matches(target, LOCK)


def test_user_directory_without_stamp_is_used_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheelhouse.subprocess, "run", FakePip([]))
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"x")
    got = wheelhouse.ensure(LOCK, tmp_path)
    assert (got.built, got.files) == (False, ("a-1.0-py3-none-any.whl",))
    assert wheelhouse.given(tmp_path).files == ("a-1.0-py3-none-any.whl",)
    with pytest.raises(wheelhouse.WheelhouseError, match=r"no \.whl files"):
        wheelhouse.given(tmp_path / "missing")


def test_download_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheelhouse.subprocess, "run", FakePip([], returncode=1))
    with pytest.raises(wheelhouse.WheelhouseError) as info:
        wheelhouse.ensure(LOCK, tmp_path / "wh")
    assert info.value.message == (
        "pip download for reference-cpu.txt failed: ERROR: No matching distribution found for torch==2.13.0"
    )
    assert sorted(tmp_path.iterdir()) == []  # neither the target nor the staging dir is left
