"""Runs at start-up in every Python process whose PYTHONPATH starts with this directory (run.sh sets it for the
harness and, through the environment, for every SGLang process the engine driver spawns; spawned children inherit
the environment, not the parent's monkeypatches):

1. torchvision: the real one if it imports, else the inert stub of tests/runtime/sglang_cpu.py (SGLang imports it
   at module level for multimodal preprocessing only).
2. gpu_patches.install(): the import-time patches of SGLang's CUDA path (G1-G6, P4).
3. with DDTREE_DEV_CAUSAL_VERIFY_GRAPHS=1 only: the tree worker as it was before ddtree.sglang.graph_masks
   (SGLang's target-verify graphs captured without the tree mask), for a before/after comparison on the GPU;
   with DDTREE_DEV_NO_CAUSAL_DEFAULT=1 only: the graphs read the mask, but a chain verify gets no causal one
   (what mixed_batch.py must catch).

`sgl_kernel`, the torch stand-in for SGLang's binary kernel package, is found on the same path.
"""

from __future__ import annotations

import importlib.util
import os
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
    causal_graphs = os.environ.get("DDTREE_DEV_CAUSAL_VERIFY_GRAPHS") == "1"
    if causal_graphs or os.environ.get("DDTREE_DEV_NO_CAUSAL_DEFAULT") == "1":
        import ddtree.sglang.graph_masks as graph_masks

        graph_masks.mask_unmasked_verifies = lambda attn_backend: None  # chain verifies bring no mask
        if causal_graphs:  # and the graphs are captured without one, as SGLang does for DFLASH
            graph_masks.capture_with_tree_masks = lambda dflash_utils, attention_backend: None
            graph_masks.captured_with_tree_masks = lambda dflash_utils, target_attn_backend: True


_setup()
