"""Rendering: golden files for 4 modes x 2 engines, systemd-analyze verify, and no secret outside 0600 files."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from opsctl.errors import InventoryError
from opsctl.inventory.load import load_inventory
from opsctl.render import Secrets, render_service
from tests.conftest import REPO, run_cli

GOLDEN = Path(__file__).parent / "golden"
SECRET = "s3cr3t-golden-value-7f1c"
SERVICES = [f"{e}-{m}" for e in ("sgl", "ref") for m in ("baseline", "linear", "shadow", "tree")]


@pytest.fixture
def golden_inventory(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", SECRET)
    return load_inventory(GOLDEN / "inventory.yaml")


@pytest.mark.parametrize("name", SERVICES)
def test_golden_files(golden_inventory, name: str) -> None:
    host = golden_inventory.hosts[0]
    rendered = render_service(host, host.service(name), "20260101T000000Z-abc123", Secrets.MASK)
    for file in rendered.files:
        path = GOLDEN / name / file.name
        if os.environ.get("OPSCTL_UPDATE_GOLDEN"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(file.text)
        assert file.text == path.read_text(), f"{name}/{file.name} differs from its golden file"


def test_modes_render_the_right_flags(golden_inventory) -> None:
    host = golden_inventory.hosts[0]
    flags = {name: render_service(host, host.service(name), "r").flags for name in SERVICES}
    assert "--speculative-algorithm" not in flags["sgl-baseline"]
    assert flags["sgl-linear"][flags["sgl-linear"].index("--speculative-algorithm") + 1] == "DFLASH"
    for name in ("sgl-shadow", "sgl-tree", "ref-shadow", "ref-tree"):
        f = flags[name]
        assert f[f.index("--speculative-algorithm") + 1] == "DDTREE"
        assert "--disable-overlap-schedule" in f
        assert f[f.index("--page-size") + 1] == "1"
        assert f[f.index("--attention-backend") + 1] == "triton"
    env = render_service(host, host.service("sgl-tree"), "r").env
    assert "DDTREE_VERIFY=tree\n" in env and "DDTREE_BUDGET=15\n" in env and "DDTREE_LOG_INTERVAL=20\n" in env
    assert "DDTREE_VERIFY=shadow\n" in render_service(host, host.service("ref-shadow"), "r").env
    assert "DDTREE_" not in render_service(host, host.service("sgl-linear"), "r").env
    assert "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1" in render_service(host, host.service("sgl-shadow"), "r").env
    assert "SGLANG_DFLASH_EAGER" not in render_service(host, host.service("sgl-tree"), "r").env  # policy auto
    assert "SGLANG_DFLASH_EAGER" not in render_service(host, host.service("sgl-linear"), "r").env
    assert "SGLANG_DFLASH_EAGER" not in render_service(host, host.service("ref-shadow"), "r").env


def test_secret_only_in_the_0600_server_config(golden_inventory) -> None:
    host = golden_inventory.hosts[0]
    for name in SERVICES:
        revealed = render_service(host, host.service(name), "r", Secrets.REVEAL)
        masked = render_service(host, host.service(name), "r", Secrets.MASK)
        holders = [f for f in revealed.files if SECRET in f.text]
        assert [f.name for f in holders] == ["server.yaml"] and holders[0].mode == 0o600
        assert SECRET not in " ".join(revealed.exec_start + revealed.flags)
        assert all(SECRET not in f.text for f in masked.files)
        assert 'api-key: "***"' in masked.server_config


def test_secret_never_in_cli_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", SECRET)
    inv = str(GOLDEN / "inventory.yaml")
    for args in (["render", "-i", inv], ["render", "-i", inv, "--json"], ["render", "-i", inv, "--out", str(tmp_path)]):
        result = run_cli(*args)
        assert result.exit_code == 0, result.stderr
        assert SECRET not in result.stdout + result.stderr
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "api-key" in written and SECRET not in written


def test_missing_secret_env_is_one_line(monkeypatch: pytest.MonkeyPatch, golden_inventory) -> None:
    from opsctl.errors import OpsctlError

    monkeypatch.delenv("OPSCTL_GOLDEN_KEY")
    host = golden_inventory.hosts[0]
    with pytest.raises(OpsctlError, match="environment variable OPSCTL_GOLDEN_KEY is not set"):
        render_service(host, host.service("sgl-tree"), "r", Secrets.REVEAL)


def _verify_root(tmp_path: Path, venv: str) -> Path:
    """A root for `systemd-analyze verify --root`: the system's units plus the venv's python (a stub)."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    python = root / venv.lstrip("/") / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    return root


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_ct200_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("render", "-i", str(REPO / "inventory/ct200.yaml"), "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "WARNING" not in result.stderr.upper() and "UNSAFE" not in result.stderr  # nothing to warn about
    root = _verify_root(tmp_path, "/opt/opsctl/venv")
    units = sorted(out.rglob("opsctl-*.service"))
    assert [u.name for u in units] == ["opsctl-gpu0.service", "opsctl-gpu1.service"]
    for unit in units:
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
        proc = subprocess.run(
            ["systemd-analyze", "verify", f"--root={root}", unit.name], capture_output=True, text=True, check=False
        )
        assert (proc.returncode, proc.stdout + proc.stderr) == (0, ""), unit.name
        assert (unit.parent / "env").stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_catches_a_broken_unit(tmp_path: Path) -> None:
    """The verify check above can fail: a misspelt directive produces output."""
    root = _verify_root(tmp_path, "/opt/opsctl/venv")
    inv = load_inventory(REPO / "inventory/ct200.yaml")
    unit = render_service(inv.hosts[0], inv.hosts[0].services[0], "r").unit.replace("KillMode=mixed", "KillMode=mixd")
    (root / "etc/systemd/system/opsctl-gpu0.service").write_text(unit)
    proc = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "opsctl-gpu0.service"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "kill mode" in (proc.stdout + proc.stderr).lower()


def test_cli_import_loads_no_gpu_stack() -> None:
    proc = subprocess.run(
        ["python", "-X", "importtime", "-c", "import opsctl.cli.app"], capture_output=True, text=True, check=True
    )
    modules = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "opsctl" in modules
    assert not modules & {"torch", "transformers", "sglang", "ddtree"}


def test_help_lists_every_command() -> None:
    result = run_cli("--help")
    for command in ("provision", "deploy", "smoke", "logs", "status", "rollback", "bench", "lab", "render"):
        assert f"  {command} " in result.stdout


def test_a_read_back_that_passed_is_remembered_and_a_refusal_never_is() -> None:
    """render's read-backs run once per distinct input (a fleet renders the same files on many hosts); a
    refusal is raised, and worded, every time."""
    from opsctl.errors import OpsctlError
    from opsctl.render import _PASSED, _checked_once

    calls: list[str] = []

    def passes(text: str) -> None:
        calls.append(text)

    def refuses() -> None:
        calls.append("refused")
        raise OpsctlError("the unit of x: systemd would read an unexpected Foo= line")

    for text in ("a", "a", "b", "a"):
        _checked_once("unit-test", (text, SECRET), lambda text=text: passes(text))
    assert calls == ["a", "b"]
    for _ in range(2):
        with pytest.raises(OpsctlError, match="unexpected Foo="):
            _checked_once("unit-test", ("bad",), refuses)
    assert calls[2:] == ["refused", "refused"]
    assert not any(SECRET.encode() in key for key in _PASSED)  # digests only: no text, no secret kept


@pytest.mark.parametrize("key", ["DDTREE_REPLAY_ACCEPTANCE", "DDTREE_RECORD_ROUNDS", "DDTREE_TEST_POLICY"])
def test_render_refuses_the_runtimes_test_hooks(golden_inventory, key: str) -> None:
    """The inventory refuses them; a Service built in code (a bench, a later loader) is refused at render too."""
    host = golden_inventory.hosts[0]
    service = dataclasses.replace(host.service("sgl-tree"), extra_env=((key, "/tmp/x"),))
    with pytest.raises(InventoryError, match=rf"services\.sgl-tree\.env\.{key}: is a benchmark test hook"):
        render_service(host, service, "r")
    assert key not in render_service(host, host.service("sgl-tree"), "r").env
