"""Progress on long waits: a fake slow step shows lines, a quick one none; `--json` keeps them off stdout."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from opsctl import pip_index, progress, wheelhouse
from opsctl.errors import UnreachableError
from opsctl.pip_index import Choice
from opsctl.progress import Ticker, run_streamed
from tests.conftest import REPO, run_cli


def test_a_quick_wait_prints_nothing() -> None:
    lines: list[str] = []
    with Ticker("quick", out=lines.append, every=1.0) as ticker:
        ticker.update("a detail")
    assert lines == []


def test_a_slow_step_is_never_silent_longer_than_every() -> None:
    """No update at all: the heartbeat alone says so (first after 0.1 s, then every 0.2 s), then how it ended.
    The step lasts until three heartbeats came (bounded), not a fixed sleep: under a loaded CPU the heartbeat
    thread may be late, and the test asks that it comes, not that it comes on time."""
    lines: list[str] = []
    deadline = time.monotonic() + 30
    with Ticker("fake slow step", out=lines.append, every=0.1):
        while len(lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(lines) >= 4, lines
    assert all(re.fullmatch(r"fake slow step: waiting \(\d+s\)", ln) for ln in lines[:-1]), lines
    assert re.fullmatch(r"fake slow step: done after \d+s", lines[-1]), lines


def test_updates_show_the_latest_detail_and_the_limit() -> None:
    lines: list[str] = []
    with Ticker("waiting for /health", out=lines.append, every=0.1, limit=300) as ticker:
        ticker.update("last answer connection refused")
        time.sleep(0.25)
        ticker.update("last answer HTTP 503")
        time.sleep(0.25)
    assert "waiting for /health: last answer connection refused (0s of 5m00s)" in lines
    assert "waiting for /health: last answer HTTP 503 (0s of 5m00s)" in lines


def test_a_failed_wait_says_failed() -> None:
    lines: list[str] = []
    with pytest.raises(RuntimeError), Ticker("step", out=lines.append, every=0.1):
        time.sleep(0.25)
        raise RuntimeError("boom")
    assert re.fullmatch(r"step: failed after \ds", lines[-1]), lines


def test_elapsed_and_bytes_read_well() -> None:
    assert [progress.elapsed(s) for s in (0.4, 59, 61, 3725)] == ["0s", "59s", "1m01s", "62m05s"]
    assert [progress.human_bytes(n) for n in (512, 64_000, 190_200_000, 54e9)] == [
        "512 B", "64.0 kB", "190.2 MB", "54.0 GB",
    ]  # fmt: skip


def test_run_streamed_hands_over_lines_as_they_come(tmp_path: Path) -> None:
    # A handshake, not a timing: the child waits for the file the callback writes on line "0" before it prints
    # line "1". Lines handed over only at the end would leave it waiting out its 20 s and printing "late".
    flag = tmp_path / "seen-0"
    script = (
        "import os, sys, time\n"
        "print(0, flush=True)\n"
        "deadline = time.monotonic() + 20\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('1 seen' if os.path.exists(sys.argv[1]) else '1 late', flush=True)\n"
    )
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line.strip())
        if line.strip() == "0":
            flag.write_text("")

    done = run_streamed([sys.executable, "-c", script, str(flag)], on_line)
    assert done.exit_code == 0 and done.tail == ("0", "1 seen")
    assert seen == ["0", "1 seen"]


def test_run_streamed_kills_on_timeout_and_on_cancel() -> None:
    sleeper = [sys.executable, "-c", "import time; print('start', flush=True); time.sleep(30)"]
    start = time.monotonic()
    timed = run_streamed(sleeper, lambda _: None, timeout=0.5)
    assert timed.timed_out and not timed.cancelled and time.monotonic() - start < 15
    start = time.monotonic()
    cancelled = run_streamed(sleeper, lambda _: None, cancelled=lambda: time.monotonic() - start > 0.5)
    assert cancelled.cancelled and time.monotonic() - start < 15


def test_provision_json_keeps_progress_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`opsctl provision --plan --json` with a slow wheelhouse download (fake pip, 0.6 s per wheel, progress
    every 0.2 s): stdout is exactly the JSON document, every progress line is on stderr."""
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "reference-cpu.txt").write_text("uvicorn\n")
    inventory = tmp_path / "inv.yaml"
    model = {"source": str(tmp_path / "m"), "source_on": "host", "path": "/dev/shm/m"}
    inventory.write_text(json.dumps({
        "defaults": {"wheelhouse": str(tmp_path / "wh"), "service": {"engine": "reference", "device": "cpu"}},
        "hosts": {"h1": {"address": "10.0.0.1", "gpus": 0,
                         "services": {"s1": {"port": 30000, "mode": "baseline", "model": model}}}},
    }))  # fmt: skip
    monkeypatch.setenv("OPSCTL_LOCKS_DIR", str(locks))
    monkeypatch.setenv("FAKE_PIP_WHEELS", "a-1.0-py3-none-any.whl,b-1.0-py3-none-any.whl")
    monkeypatch.setenv("FAKE_PIP_DELAY", "0.6")
    monkeypatch.setattr(progress, "EVERY_S", 0.2)
    monkeypatch.setattr(wheelhouse, "PIP", (sys.executable, str(REPO / "tests/fixtures/bin/fake_pip.py")))
    monkeypatch.setattr(pip_index, "decide", Choice)  # every index reachable: no probe, no network

    def unreachable(spec: object) -> object:
        raise UnreachableError("h1", "no route (test)")

    monkeypatch.setattr("opsctl.remote.connect", unreachable)
    result = run_cli("provision", "-i", str(inventory), "--plan", "--json")
    body = json.loads(result.stdout)  # nothing but the document
    assert body["hosts"][0]["host"] == "h1" and body["hosts"][0]["error"] == "h1: unreachable: no route (test)"
    wheel_lines = [ln for ln in result.stderr.splitlines() if ln.startswith("wheelhouse reference-cpu.txt: ")]
    assert any("a-1.0-py3-none-any.whl" in ln for ln in wheel_lines), result.stderr
    assert wheel_lines[-1].startswith("wheelhouse reference-cpu.txt: done after"), result.stderr
    assert "wheelhouse" not in result.stdout
