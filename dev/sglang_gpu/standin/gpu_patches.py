"""Import-time patches that let SGLang 0.5.23's CUDA path run on the H200 dev machine without its JIT toolchain,
flashinfer or cutlass (/work/shared/notes/sglang-on-h200.md, "What SGLang's CUDA path calls that is missing").

Installed SGLang files are never edited: `install()` (called from this directory's sitecustomize.py, so in every
SGLang process, the spawned scheduler and detokenizer too) patches each module right after it is first imported,
with the meta-path machinery of the CPU engine test (tests/runtime/sglang_engine/engine_patches.py, whose
loader wrapper and model-runner patch are reused, not copied). Each patch below only swaps a CUDA-only kernel for
the Triton or torch version SGLang ships for the same thing, or turns off a path that would need the missing
pieces; none changes what a correct kernel computes.

- G1 `sglang/kernels/jit/utils/compile/loader.py:49` (`load_jit`): raises at once (no nvcc/ninja here). Guarded
  callers fall back; an unguarded one fails loudly naming the module.
- G2 `sglang/srt/models/utils.py:514-531`: `can_use_fused_inplace_qknorm` answers False, so q/k norm takes its
  torch path instead of retrying (and warning about) the JIT build on every call.
- G3 `sglang/srt/layers/dual_gemm.py:32-44` (`DualGemm._select_mode`): no mode, so dense MLPs never import
  cutlass's CuTe DSL (an SM100 kernel).
- G4 `sglang/kernels/ops/speculative/tree.py` (JIT `build_tree_kernel_efficient`, `verify_tree_greedy`, used by
  `spec_tree.py:31-34,491-505`): routed to the Triton versions in `spec_tree.py` (`:318`, `:447`).
- G5 `sglang/kernels/ops/sampling/renorm.py:9-13` (flashinfer lazy imports): routed to `renorm_triton.py`.
- G6 `sglang/srt/speculative/dflash_utils.py:13-14,46`: DFLASH's sampling verify, SGLang's JIT CUDA kernel
  `tree_speculative_sampling_target_only` (`kernels/ops/speculative/sampling.py`), becomes the torch version in
  `spec_sampling.py` (`chain_speculative_sampling_target_only`: DFLASH passes chains only,
  `_get_or_create_chain_verify_buffers`), so `linear` at temperature > 0 really samples; its start-up prewarm
  (`dflash_worker_v2.py:802`) runs it with G5's Triton renormalisation. `DDTREE_DEV_GREEDY_DFLASH_VERIFY=1` turns
  the path off instead (`_DFLASH_SAMPLING_VERIFY_AVAILABLE = False`: DFLASH verifies sampled batches greedily, as
  every GPU run before this patch did).
- P4 (engine_patches.py) `sglang/srt/model_executor/model_runner.py:1772`: the drafter's input_embeds in the
  runner's dtype, not always bfloat16 (float32 models).

Not patched, on purpose: `clamp_position` (`forward_batch_info.py:1228`) is a `BaseFusedOp`, and so are RMSNorm,
SiluAndMul and RotaryEmbedding: `SGLANG_FORCE_FUSED_OP_BACKEND=torch` (`kernels/fused_op.py:641`) runs their
`forward_native`. `store_cache` falls back by itself. `APPLIED` lists what ran in this process.

- T1 (only with `DDTREE_ROUND_TIMER=<file>`; measurement, not a fix) `sglang/srt/speculative/dflash_worker_v2.py`:
  every DFLASH worker (and DDTREE's tree worker, a subclass) times its decode rounds with CUDA events
  (`round_timer.py`; dev/sglang_gpu/cost_bench.py reads the file).
- R1 (only with `DDTREE_DFLASH_RECORD=<file>` or `DDTREE_DFLASH_REPLAY=<file>`; a benchmark hook)
  `sglang/srt/speculative/dflash_worker_v2.py:2187` (`_accept_block`): DFLASH's accepted lengths per request and
  round recorded, or replayed from a real pair's recording (`dflash_replay.py`).
- T3 (only with `DDTREE_LOOP_TIMER=<file>`; measurement) `sglang/srt/managers/scheduler.py`: the scheduler loop's
  phases timed on the host per decode iteration (`loop_timer.py`), where the time between rounds goes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[3]
CPU_ENGINE_DIR = REPO / "tests" / "runtime" / "sglang_engine"
APPLIED: list[str] = []


def _load_by_path(name: str, path: Path) -> ModuleType:
    """Import `path` as module `name` without putting its directory on sys.path (that directory also holds the
    CPU `sgl_kernel` stand-in, which must not shadow this one)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cpu_engine_patches() -> ModuleType:
    """tests/runtime/sglang_engine/engine_patches.py (P4 and the patching loader are shared with the CPU test)."""
    return _load_by_path("ddtree_cpu_engine_patches", CPU_ENGINE_DIR / "engine_patches.py")


class JitUnavailable(ImportError, RuntimeError):
    """SGLang's JIT kernels cannot be built here. An ImportError and a RuntimeError, so callers that guard the
    build with either fall back."""


def _patch_jit_loader(module: ModuleType) -> None:
    """G1: `sglang/kernels/jit/utils/compile/loader.py:49` `load_jit` raises JitUnavailable at once (the package
    `sglang.kernels.jit.utils` re-exports this name, bound after this patch)."""

    def load_jit(*args: str, **kwargs: Any) -> Any:
        raise JitUnavailable(
            f"SGLang JIT kernel {'/'.join(args) or '?'} cannot be built on this host (dev/sglang_gpu: no nvcc); "
            "its caller has no fallback"
        )

    module.load_jit = load_jit
    APPLIED.append("G1")


def _patch_models_utils(module: ModuleType) -> None:
    """G2: `sglang/srt/models/utils.py:514-531` calls `can_use_fused_inplace_qknorm` (`kernels/ops/layernorm/
    norm.py:92`), which tries the JIT build on every call and logs a warning when it fails; answer False so the
    q/k norm takes its torch path quietly."""

    def can_use_fused_inplace_qknorm(head_dim: int, dtype: Any) -> bool:
        return False

    module.can_use_fused_inplace_qknorm = can_use_fused_inplace_qknorm
    APPLIED.append("G2")


def _patch_dual_gemm(module: ModuleType) -> None:
    """G3: `sglang/srt/layers/dual_gemm.py:32-44` (`DualGemm._select_mode`) imports
    `sglang.kernels.ops.gemm.cutedsl_dual_gemm` (cutlass CuTe DSL, SM100) for every dense MLP on CUDA; no mode
    means the plain gate/up GEMM."""

    def _select_mode(self: Any, gate_up_proj: Any, hidden_size: int) -> None:
        return None

    module.DualGemm._select_mode = _select_mode
    APPLIED.append("G3")


def _patch_spec_tree_jit(module: ModuleType) -> None:
    """G4: the JIT tree kernels of `sglang/kernels/ops/speculative/tree.py`, imported by `spec_tree.py:31-34`
    (`build_tree_kernel_efficient`, bound at import) and `:491-505` (`verify_tree_greedy`, imported per call),
    become adapters to the Triton versions in `spec_tree.py`: `sgl_build_tree_kernel_triton` (`:318`, same
    positional arguments) and `verify_tree_greedy_triton` (`:447`, `retrieve_*` instead of `retrive_*`)."""

    def build_tree_kernel_efficient(*args: Any) -> None:
        from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton

        sgl_build_tree_kernel_triton(*args)

    def verify_tree_greedy(
        *,
        predicts: Any,
        accept_index: Any,
        accept_token_num: Any,
        candidates: Any,
        retrive_index: Any,
        retrive_next_token: Any,
        retrive_next_sibling: Any,
        target_predict: Any,
    ) -> None:
        from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

        verify_tree_greedy_triton(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, target_predict,
        )  # fmt: skip

    module.build_tree_kernel_efficient = build_tree_kernel_efficient
    module.verify_tree_greedy = verify_tree_greedy
    APPLIED.append("G4")


def _patch_renorm(module: ModuleType) -> None:
    """G5: `sglang/kernels/ops/sampling/renorm.py:9-13` resolves top-k / top-p renormalisation to flashinfer on
    CUDA (absent here); use SGLang's Triton versions (`renorm_triton.py`, what ROCm uses). Importers
    (`dflash_utils.py:12`, `eagle_utils.py:11`) bind the names after this patch."""
    from sglang.kernels.ops.sampling.renorm_triton import top_k_renorm_probs_triton, top_p_renorm_probs_triton

    module.top_k_renorm_prob = top_k_renorm_probs_triton
    module.top_p_renorm_prob = top_p_renorm_probs_triton
    APPLIED.append("G5")


def _patch_dflash_utils(module: ModuleType) -> None:
    """G6: `sglang/srt/speculative/dflash_utils.py:13-14,46`: DFLASH's sampling verify (a JIT CUDA kernel, bound
    into this module at import) becomes the torch chain version of `spec_sampling.py`; with
    `DDTREE_DEV_GREEDY_DFLASH_VERIFY=1` it is reported unavailable instead (read through
    `is_dflash_sampling_verify_available()` and the module global)."""
    if os.environ.get("DDTREE_DEV_GREEDY_DFLASH_VERIFY") == "1":
        module._DFLASH_SAMPLING_VERIFY_AVAILABLE = False
    else:
        import spec_sampling

        module.tree_speculative_sampling_target_only = spec_sampling.chain_speculative_sampling_target_only
        module._DFLASH_SAMPLING_VERIFY_AVAILABLE = True
    APPLIED.append("G6")


def _patch_model_runner(module: ModuleType) -> None:
    """P4 of tests/runtime/sglang_engine/engine_patches.py (`model_runner.py:1772`): input_embeds in the runner's
    dtype (DFLASH feeds its drafter input_embeds; a float32 model would get bfloat16 ones)."""
    cpu_engine_patches()._patch_model_runner(module)
    APPLIED.append("P4")


def _patch_round_timer(module: ModuleType) -> None:
    """T1: round_timer.patch_worker_class (per-round CUDA-event timing, DDTREE_ROUND_TIMER set)."""
    import round_timer

    round_timer.patch_worker_class(module)
    APPLIED.append("T1")


def _patch_dflash_replay(module: ModuleType) -> None:
    """R1: dflash_replay.patch_worker_class (DFLASH's accepted lengths recorded or replayed)."""
    import dflash_replay

    dflash_replay.patch_worker_class(module)
    APPLIED.append("R1")


def _both(first: Callable[[ModuleType], None], second: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        first(module)
        second(module)

    return patch


def _patch_loop_timer(module: ModuleType) -> None:
    """T3: loop_timer.patch_scheduler (host time per scheduler-loop phase, DDTREE_LOOP_TIMER set)."""
    import loop_timer

    loop_timer.patch_scheduler(module)
    APPLIED.append("T3")


def _patch_tree_timer(module: ModuleType) -> None:
    """T2: round_timer.patch_tree_worker (DDTREE's build cut into head / plan / mask / prep)."""
    import round_timer

    round_timer.patch_tree_worker(module)
    APPLIED.append("T2")


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "sglang.kernels.jit.utils.compile.loader": _patch_jit_loader,
    "sglang.srt.models.utils": _patch_models_utils,
    "sglang.srt.layers.dual_gemm": _patch_dual_gemm,
    "sglang.kernels.ops.speculative.tree": _patch_spec_tree_jit,
    "sglang.kernels.ops.sampling.renorm": _patch_renorm,
    "sglang.srt.speculative.dflash_utils": _patch_dflash_utils,
    "sglang.srt.model_executor.model_runner": _patch_model_runner,
}


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Finds PATCHES' modules with the other finders, wrapping their loader in engine_patches' _PatchingLoader."""

    def __init__(self, loader_class: Any) -> None:
        self.loader_class = loader_class

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = self.loader_class(spec.loader, patch)
                return spec
        return None


def install() -> None:
    """Patch each module when it is first imported (or now, if it already is). Idempotent."""
    if any(isinstance(finder, _PatchFinder) for finder in sys.meta_path):
        return
    if os.environ.get("DDTREE_ROUND_TIMER"):
        PATCHES["sglang.srt.speculative.dflash_worker_v2"] = _patch_round_timer
        PATCHES["ddtree.sglang.round_runner"] = _patch_tree_timer
    if os.environ.get("DDTREE_DFLASH_RECORD") or os.environ.get("DDTREE_DFLASH_REPLAY"):
        name = "sglang.srt.speculative.dflash_worker_v2"  # R1 before T1: T1 wraps the patched round per worker
        PATCHES[name] = _both(_patch_dflash_replay, PATCHES[name]) if name in PATCHES else _patch_dflash_replay
    if os.environ.get("DDTREE_LOOP_TIMER"):
        PATCHES["sglang.srt.managers.scheduler"] = _patch_loop_timer
    sys.meta_path.insert(0, _PatchFinder(cpu_engine_patches()._PatchingLoader))
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
