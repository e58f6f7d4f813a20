"""Shared test helpers: run the real `opsctl` CLI in-process and capture stdout/stderr/exit code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    from opsctl.cli.app import app

    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def cli():
    return run_cli


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without interpreter finalization once every report is written.

    In a fresh venv, a run that loaded torch, transformers' tokenizers and hypothesis segfaulted *after* all
    tests passed and the summary was printed (in native finalizers: "no Python frame"), turning a green run red.
    Exiting here keeps pytest's own exit status and skips those finalizers."""
    import os
    import sys

    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
