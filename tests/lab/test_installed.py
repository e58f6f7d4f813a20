"""The opsctl wheel, installed into a fresh venv and run from a directory outside the checkout, provisions,
deploys and smoke-tests the lab: the runtime every host gets is the wheel the opsctl wheel carries."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from opsctl.commands import Cmd
from opsctl.wheel import remote_wheel_path
from tests.lab.deploy_support import MODE, PROVISION_ARGS, derived_inventory, remote_run, tune
from tests.unit.installed_opsctl import bundled_wheel, installed_venv, run

pytestmark = pytest.mark.lab


def test_installed_opsctl_provisions_deploys_and_smokes_the_lab(lab_hosts: Any, tmp_path: Path) -> None:
    venv = installed_venv(tmp_path / "build")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    inventory = derived_inventory(outside / "lab.yaml", tune)
    opsctl = str(venv / "bin" / "opsctl")

    def step(*args: str) -> str:
        done = run([opsctl, *args, "-i", str(inventory)], outside, timeout=1800)
        assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr
        return done.stdout

    step("provision", *PROVISION_ARGS)
    step("deploy", "--mode", MODE)
    step("smoke")
    wheel = bundled_wheel(venv)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    for host in ("lab1", "lab2"):  # each host holds the bundled wheel at its content-addressed path
        on_host = remote_run(inventory, host, Cmd.of("sha256sum", remote_wheel_path(wheel.name, digest)))
        assert on_host.split()[0] == digest
    assert os.path.commonpath([venv, wheel]) == str(venv)
