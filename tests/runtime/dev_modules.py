"""Load a development script (dev/, never installed) as a module by its path, once per process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

DEV = Path(__file__).resolve().parents[2] / "dev"


def load(name: str, path: Path) -> ModuleType:
    """The module at `path`, registered in sys.modules as `name` (a second call returns the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
