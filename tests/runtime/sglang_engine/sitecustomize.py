"""Runs at start-up in every Python process whose PYTHONPATH holds this directory: the SGLang engine test's
driver and the scheduler / detokenizer processes SGLang spawns from it (spawned children inherit the
environment, not the parent's monkeypatches). Only test_sglang_engine.py sets that PYTHONPATH, and only for its
subprocesses; the pytest process never imports SGLang.

1. torchvision: the inert stub of tests/runtime/sglang_cpu.py when the real one is missing or cannot load.
2. engine_patches.install(): SGLang's CPU-specific refusals (P1/P3/P4/P7-P9/P11) and CUDA's conv-window layout (P10),
   applied as each module is imported.
3. triton_interpreter.install() under TRITON_INTERPRET=1: device-function calls skip re-patching triton.language.
(`sgl_kernel`, the stand-in for SGLang's CPU kernel package, is found on the same path.)
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path


def _setup() -> None:
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here.parent))  # tests/runtime, for sglang_cpu
    try:
        import sglang_cpu
        import triton_interpreter
    finally:
        sys.path.remove(str(here.parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sglang_cpu._torchvision_or_stub()
    import engine_patches

    engine_patches.install()
    if os.environ.get("TRITON_INTERPRET") == "1":
        triton_interpreter.install()


_setup()
