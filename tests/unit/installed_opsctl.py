"""An opsctl wheel built from this checkout and installed (not editable) into a fresh venv, offline, in seconds.

The wheel is built with --no-build-isolation from a copy of the shipped sources and installed with --no-deps
--no-index; the venv reaches opsctl's dependencies through a .pth line naming this interpreter's site-packages (a
plain path entry: that directory's own .pth files, an editable opsctl's finder among them, are not processed, so
`import opsctl` in the venv finds only the installed wheel). Used by tests/unit/test_wheel_install.py and the
lab's tests/lab/test_installed.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "opsctl", "playbooks", "locks", "runtime")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def installed_venv(tmp: Path) -> Path:
    """Build the wheel under `tmp` and install it into the venv `tmp/venv`; returns the venv."""
    src = tmp / "src"
    src.mkdir(parents=True)
    for name in SHIPPED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=IGNORE)
        else:
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), str(src)], tmp)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("opsctl-*.whl")
    env = tmp / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(env)], tmp).returncode == 0
    python = env / "bin" / "python"
    installed = run([*pip, "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp)
    assert installed.returncode == 0, installed.stderr[-2000:]
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib.stdout.strip()) / "opsctl-test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return env


def bundled_wheel(venv: Path) -> Path:
    (wheel,) = venv.glob("lib/python*/site-packages/opsctl/data/runtime/ddtree_runtime-*.whl")
    return wheel
