"""Printed result lines name the host, the service and the outcome once each: `lab2/ref: unreachable ...`, never
`lab2/ref: unreachable lab2: unreachable: ...` nor `interrupted interrupted: ...`."""

from __future__ import annotations

import pytest

from opsctl.cli import deploy as deploy_cli
from opsctl.deploy.flow import ServiceResult
from opsctl.deploy.outcome import Outcome
from opsctl.errors import UnreachableError, host_line, without_prefixes


def test_host_line_names_the_host_once() -> None:
    err = UnreachableError("lab2", "timed out").one_line()
    assert host_line("lab2", err) == err
    assert host_line("lab2/ref", err).startswith("lab2/ref: unreachable: timed out")
    assert host_line("lab2/ref", "lab2/ref: gone") == "lab2/ref: gone"
    assert host_line("lab2/ref", "journalctl exited 1") == "lab2/ref: journalctl exited 1"
    assert host_line("lab2", "lab20: x") == "lab2: lab20: x"  # another host's name is not ours


@pytest.mark.parametrize(
    ("message", "words", "want"),
    [
        ("lab2: unreachable: timed out", ("lab2", "unreachable"), "timed out"),
        ("unreachable: lab2: timed out", ("lab2", "unreachable"), "timed out"),
        ("interrupted: old restored", ("interrupted",), "old restored"),
        (
            "interrupted while staging: nothing switched",
            ("interrupted",),
            "interrupted while staging: nothing switched",
        ),
        ("lab2x: y", ("lab2",), "lab2x: y"),
        ("", ("lab2",), ""),
    ],
)
def test_without_prefixes(message: str, words: tuple[str, ...], want: str) -> None:
    assert without_prefixes(message, *words) == want


@pytest.mark.parametrize(
    ("outcome", "message", "want"),
    [
        (
            Outcome.UNREACHABLE,
            UnreachableError("lab2", "timed out").one_line(),
            "lab2/ref: unreachable timed out (check the address, port and that sshd runs)",
        ),
        (
            Outcome.INTERRUPTED,
            "interrupted: R1 restored and healthy; R2 marked bad",
            "lab2/ref: interrupted R1 restored and healthy; R2 marked bad",
        ),
        (
            Outcome.FAILED,
            "health gate failed: [Errno 111] refused",
            "lab2/ref: failed health gate failed: [Errno 111] refused",
        ),
    ],
)
def test_deploy_result_line_says_each_thing_once(
    outcome: Outcome, message: str, want: str, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy_cli._print_result(ServiceResult("lab2", "ref", outcome, "R2", "R1", message), plan=False)
    (line,) = capsys.readouterr().err.splitlines()
    assert line == want


def test_an_interrupted_canary_says_interrupted_once(capsys: pytest.CaptureFixture[str]) -> None:
    from opsctl.rollout.canary import CanaryReport
    from opsctl.rollout.runner import RunReport

    canary = CanaryReport("front", "interrupted", message="interrupted: canary rolled back, the old release serves")
    deploy_cli.print_report(RunReport("deploy"), as_json=False, canary=canary)
    err = capsys.readouterr().err
    assert "canary behind router front: interrupted: canary rolled back, the old release serves" in err
    assert "interrupted: interrupted:" not in err
