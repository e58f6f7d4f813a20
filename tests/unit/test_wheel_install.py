"""The opsctl wheel, installed (not editable) into a fresh venv and run from a directory outside the checkout: it
carries its playbooks, locks and a ddtree-runtime wheel, and renders and plans like the checkout does. Offline
and fast (~10 s): tests/unit/installed_opsctl.py builds and installs it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from opsctl import provision
from opsctl.kernel.locks import locks_dir
from tests.unit.installed_opsctl import ROOT, bundled_wheel, installed_venv
from tests.unit.installed_opsctl import run as _run


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed_venv(tmp_path_factory.mktemp("wheel"))


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A working directory with a copy of the seed inventory, far from the checkout."""
    (tmp_path / "ct200.yaml").write_text((ROOT / "inventory" / "ct200.yaml").read_text())
    return tmp_path


def _installed_py(venv: Path, code: str, cwd: Path) -> str:
    proc = _run([str(venv / "bin" / "python"), "-c", code], cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_installed_opsctl_is_the_wheel_not_the_checkout(venv: Path, outside: Path) -> None:
    where = _installed_py(
        venv, "import opsctl, opsctl.bundle as b; print(opsctl.__file__); print(b.in_checkout())", outside
    )
    module, checkout = where.split()
    assert Path(module).is_relative_to(venv) and checkout == "False"


def test_version_names_the_bundled_runtime_wheel_and_its_sha256(venv: Path, outside: Path) -> None:
    proc = _run([str(venv / "bin" / "opsctl"), "--version"], outside)
    assert proc.returncode == 0, proc.stderr
    wheel = bundled_wheel(venv)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert proc.stdout.splitlines()[1] == f"ddtree-runtime 0.1.0 (bundled {wheel.name}, sha256 {digest})"


def test_the_bundled_runtime_wheel_is_what_provision_and_deploy_push(venv: Path, outside: Path) -> None:
    code = "from opsctl import artifact; w = artifact.runtime_wheel(); print(w.path); print(w.sha256)"
    path, sha256 = _installed_py(venv, code, outside).split()
    assert Path(path).is_relative_to(venv) and sha256 == hashlib.sha256(Path(path).read_bytes()).hexdigest()
    with zipfile.ZipFile(path) as whl:
        names = set(whl.namelist())
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        assert "Name: ddtree-runtime" in whl.read(metadata).decode()
    sources = {str(p.relative_to(ROOT / "runtime")) for p in (ROOT / "runtime" / "ddtree").rglob("*.py")}
    sources = {s for s in sources if "__pycache__" not in s}
    assert sources <= names, sorted(sources - names)[:5]  # every runtime module made it into the wheel


def test_playbook_and_locks_come_from_the_package(venv: Path, outside: Path) -> None:
    code = (
        "import json; from opsctl import provision; from opsctl.kernel.locks import locks_dir\n"
        "print(json.dumps([str(provision.PLAYBOOK), provision.load_playbook(provision.PLAYBOOK),"
        " {p.name: p.read_text() for p in locks_dir().iterdir()}]))"
    )
    playbook, steps, locks = json.loads(_installed_py(venv, code, outside))
    assert Path(playbook).is_relative_to(venv)
    assert tuple(steps) == provision.load_playbook(provision.PLAYBOOK)
    assert locks == {p.name: p.read_text() for p in locks_dir().iterdir()}


def test_render_from_outside_the_checkout_matches_the_checkout(venv: Path, outside: Path) -> None:
    installed = _run([str(venv / "bin" / "opsctl"), "render", "-i", "ct200.yaml"], outside)
    checkout = _run(
        [sys.executable, "-c", "from opsctl.cli.app import main; main()", "render", "-i", "ct200.yaml"], outside
    )
    assert installed.returncode == 0 == checkout.returncode, installed.stderr + checkout.stderr
    assert installed.stdout == checkout.stdout and "[Unit]" in installed.stdout


def test_provision_plan_from_outside_the_checkout_reads_the_bundled_playbook(venv: Path, outside: Path) -> None:
    inventory = yaml.safe_load((outside / "ct200.yaml").read_text())
    inventory["hosts"]["ct200"]["address"] = "127.0.0.1"  # never the seed host: no key, so the first step fails
    inventory["defaults"]["ssh"]["known_hosts_file"] = str(outside / "known_hosts")
    (outside / "local.yaml").write_text(yaml.safe_dump(inventory))
    proc = _run([str(venv / "bin" / "opsctl"), "provision", "-i", "local.yaml", "--plan", "--json"], outside)
    (host,) = json.loads(proc.stdout)["hosts"]
    steps = [step["op"] for step in host["steps"]]
    assert tuple(steps) == provision.load_playbook(provision.PLAYBOOK)  # the playbook was read, every step listed
    assert host["steps"][0]["status"] == "failed" and "known_hosts" in host["steps"][0]["error"]
    assert "Traceback" not in proc.stderr
