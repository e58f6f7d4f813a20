"""Every bash script in the repository parses (`bash -n`). The GPU job scripts run only on a lent GPU machine, where
a syntax error costs a whole job of scarce device time; CI is the place to find it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bash_scripts() -> list[Path]:
    """Tracked files whose first line names bash."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in listed.splitlines():
        path = ROOT / name
        if not path.is_file() or path.suffix not in ("", ".sh"):
            continue
        with path.open("rb") as f:
            first = f.readline()
        if first.startswith(b"#!") and b"bash" in first:
            found.append(path)
    return found


def test_the_gpu_job_scripts_are_found() -> None:
    names = {p.name for p in bash_scripts()}
    assert {"h100_fair_replay.sh", "run.sh", "check", "setup", "run"} <= names


@pytest.mark.parametrize("script", bash_scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.strip()[:400]


def test_a_script_that_does_not_parse_is_caught(tmp_path: Path) -> None:
    # the construct that once broke a job script: an apostrophe inside ${x:?...} within double quotes
    broken = tmp_path / "broken.sh"
    broken.write_text('#!/usr/bin/env bash\nfind "${2:?the jobs\' \\$OUT}" -name x\n')
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0
