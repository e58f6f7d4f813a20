"""Runs at start-up in every Python process whose PYTHONPATH starts with this directory (run.sh sets it for the
harness and, through the environment, for every SGLang process the engine driver spawns; spawned children inherit
the environment, not the parent's monkeypatches):

1. torchvision: the real one if it imports, else the inert stub of tests/runtime/sglang_cpu.py (SGLang imports it
   at module level for multimodal preprocessing only).
2. gpu_patches.install(): the import-time patches of SGLang's CUDA path (G1-G6, P4).

`sgl_kernel`, the torch stand-in for SGLang's binary kernel package, is found on the same path.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path


def _setup() -> None:
    here = Path(__file__).resolve().parent
    sglang_cpu_path = here.parents[2] / "tests" / "runtime" / "sglang_cpu.py"
    spec = importlib.util.spec_from_file_location("ddtree_sglang_cpu", sglang_cpu_path)
    if spec is not None and spec.loader is not None:
        sglang_cpu = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = sglang_cpu
        spec.loader.exec_module(sglang_cpu)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sglang_cpu._torchvision_or_stub()
    import gpu_patches

    gpu_patches.install()


_setup()
