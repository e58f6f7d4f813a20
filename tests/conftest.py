"""Shared test helpers: run the real `opsctl` CLI in-process and capture stdout/stderr/exit code."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]

# No per-example wall-clock deadline: CI runs every tier at once on two cores, where a 200 ms example can
# take a second and hypothesis calls the test flaky. Tests that guard against pathological inputs bound the
# CPU time they burn instead (test_inventory_property).
settings.register_profile("opsctl", deadline=None)
settings.load_profile("opsctl")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C works in the suite however it was started. The Ctrl-C tests signal this process and the opsctl
    processes it starts; a shell without job control starts a background job (`.ci/run &`, nohup) with SIGINT
    ignored, Python then installs no KeyboardInterrupt handler, and every child inherits the ignore: those
    tests would hang or fail. A handler set here is reset to the default on exec, so children handle it too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
