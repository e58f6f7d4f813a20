"""The rootfs build lock: a second builder (a `lab up` while scripts/setup builds in the background) says it waits."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

from opsctl.lab import rootfs
from opsctl.lab.config import LabConfig


def test_a_second_builder_says_it_waits_then_gets_the_lock(tmp_path: Path) -> None:
    cfg = LabConfig(cache_dir=tmp_path)
    lines: list[str] = []
    with (tmp_path / ".build.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        threading.Timer(0.3, fcntl.flock, (held, fcntl.LOCK_UN)).start()
        start = time.monotonic()
        with rootfs._build_lock(cfg, lines.append):
            waited = time.monotonic() - start
    assert waited >= 0.25  # it really waited for the other holder
    assert lines and lines[0] == "lab rootfs (bookworm, once): waiting for the build another process runs"


def test_a_free_lock_is_taken_without_a_word(tmp_path: Path) -> None:
    lines: list[str] = []
    with rootfs._build_lock(LabConfig(cache_dir=tmp_path), lines.append):
        pass
    assert lines == []
