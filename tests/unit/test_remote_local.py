from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from opsctl.commands import Cmd, sh
from opsctl.errors import CommandTimeout, RemoteError
from opsctl.remote import Connection, LocalHost


def test_run_returns_output_and_exit_code() -> None:
    host = LocalHost()
    assert isinstance(host, Connection)
    result = host.run(sh("echo out; echo err >&2; exit 2"), check=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "out\n", "err\n")
    assert result.command == "sh -c 'echo out; echo err >&2; exit 2'"
    with pytest.raises(RemoteError):
        host.run(Cmd.of("false"))
    assert host.run(Cmd.of("cat", stdin="from stdin")).stdout == "from stdin"


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    script = f"(sleep 1.5; touch {marker}) & sleep 30"
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        LocalHost().run(sh(script), timeout=0.5)
    assert time.monotonic() - start < 10  # far below the 30 s the command would run
    assert "timed out after 0.5s" in info.value.one_line()
    time.sleep(1.5)
    assert not marker.exists(), "the background child outlived the timeout"


def test_put_text_is_atomic_with_mode(tmp_path: Path) -> None:
    target = tmp_path / "secret.env"
    LocalHost().put_text("K=V\n", str(target), mode=0o600)
    assert target.read_text() == "K=V\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.env"]  # no temp file left


def test_put_file_get_text_sync_dir(tmp_path: Path) -> None:
    host = LocalHost()
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("a")
    host.put_file(src / "sub" / "a.txt", str(tmp_path / "copy.txt"), mode=0o640)
    assert host.get_text(str(tmp_path / "copy.txt")) == "a"
    assert stat.S_IMODE(os.stat(tmp_path / "copy.txt").st_mode) == 0o640
    host.sync_dir(src, str(tmp_path / "dst"))
    assert (tmp_path / "dst" / "sub" / "a.txt").read_text() == "a"
    with pytest.raises(RemoteError):
        host.get_text(str(tmp_path / "missing"))
