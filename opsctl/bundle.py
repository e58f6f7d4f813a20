"""Where opsctl finds the files it ships beside its code: the provision playbooks, the requirement locks and the
ddtree-runtime.

In a checkout (the repository's `runtime/pyproject.toml` sits beside the `opsctl/` package) they are the
repository's `playbooks/`, `locks/` and `runtime/`, and the runtime wheel is built from source (cached by a hash of
the sources, `opsctl.artifact`). An installed opsctl wheel carries copies under `opsctl/data/` and the runtime as a
prebuilt wheel in `opsctl/data/runtime/`: `setup.py` puts them there when the wheel is built.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

from opsctl import runtime_build

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
CHECKOUT = Path(__file__).resolve().parents[1]


def in_checkout() -> bool:
    """Whether this opsctl runs from a source checkout (a clone, or an editable install of one)."""
    return (CHECKOUT / "runtime" / "pyproject.toml").is_file() and (CHECKOUT / "playbooks").is_dir()


def _root() -> Path:
    return CHECKOUT if in_checkout() else PACKAGE_DATA


def playbooks_dir() -> Path:
    return _root() / "playbooks"


def locks_dir() -> Path:
    return _root() / "locks"


def runtime_src() -> Path | None:
    """The runtime's source tree in a checkout; None in an installed opsctl (it has the prebuilt wheel)."""
    return CHECKOUT / "runtime" if in_checkout() else None


def bundled_runtime_wheel() -> Path | None:
    """The ddtree-runtime wheel built into an installed opsctl (None in a checkout, or when absent)."""
    found = sorted((PACKAGE_DATA / "runtime").glob("ddtree_runtime-*.whl"))
    return found[-1] if found else None


def runtime_line() -> str:
    """What `opsctl --version` says of the runtime it installs on hosts."""
    src = runtime_src()
    if src is not None:
        version = tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"]
        return f"ddtree-runtime {version} (built from {src}, source hash {runtime_build.source_hash(src)})"
    wheel = bundled_runtime_wheel()
    if wheel is None:
        return "ddtree-runtime: none bundled (pass --runtime-wheel PATH.whl to provision and deploy)"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return f"ddtree-runtime {wheel.name.split('-')[1]} (bundled {wheel.name}, sha256 {digest})"
