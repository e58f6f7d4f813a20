"""The lab's tiny models: built once on the control machine (`python -m ddtree.tiny`) and cached, so
`opsctl provision -i inventory/lab.yaml` finds the sources that inventory/lab.yaml names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from opsctl.errors import LabError
from opsctl.lab.inventory import TINY_DIR

LAB_ARCH = "qwen3"
BUILD_TIMEOUT_S = 1800


def ensure_tiny_models(root: Path = Path(TINY_DIR), arch: str = LAB_ARCH) -> bool:
    """Build the tiny target + drafter for `arch` unless a complete build is cached. True when built now."""
    out = root / arch
    if _is_current(out):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ddtree.tiny", "--arch", arch, "--out", str(out)]
    if out.exists():
        argv.append("--force")  # an incomplete earlier build
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise LabError(f"building the lab's tiny models timed out after {BUILD_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named ddtree" in proc.stderr:
            raise LabError("the lab's tiny models need ddtree-runtime", "pip install -e ./runtime") from None
        raise LabError(f"building the lab's tiny models failed: {last}", f"run `{' '.join(argv)}` to see why")
    return True


def _is_current(out: Path) -> bool:
    """A complete build made by the installed runtime's tiny-model builder (build.json's build_version)."""
    if not ((out / "target" / "config.json").is_file() and (out / "draft" / "config.json").is_file()):
        return False
    try:
        built = json.loads((out / "build.json").read_text()).get("build_version")
    except (OSError, ValueError):
        return False
    try:
        from ddtree.tiny import BUILD_VERSION
    except ImportError:
        return True  # no runtime here to rebuild with: use what is cached
    return bool(built == BUILD_VERSION)
