"""The CPU engine test's sitecustomize (tests/runtime/sglang_engine), plus the scheduler loop timer
(`standin/loop_timer.py`) when `DDTREE_LOOP_TIMER` is set. Put this directory first on PYTHONPATH and
tests/runtime/sglang_engine after it (dev/sglang_gpu/host_profile.py does)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def _load(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _setup() -> None:
    here = Path(__file__).resolve().parent
    engine_dir = here.parents[2] / "tests" / "runtime" / "sglang_engine"
    _load("ddtree_cpu_engine_sitecustomize", engine_dir / "sitecustomize.py")
    if os.environ.get("DDTREE_LOOP_TIMER"):
        import engine_patches  # imported by the CPU sitecustomize above, from tests/runtime/sglang_engine

        sys.path.insert(0, str(here.parent / "standin"))
        try:
            import loop_timer
        finally:
            sys.path.remove(str(here.parent / "standin"))
        engine_patches.PATCHES["sglang.srt.managers.scheduler"] = loop_timer.patch_scheduler


_setup()
