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
