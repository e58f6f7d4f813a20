"""The monkeypatches SGLang 0.5.23's engine needs to run DFLASH (and the DDTREE plugin, which is DFLASH
underneath), on the dense and the hybrid (Gated DeltaNet) tiny targets, on a CPU with the Triton attention
backend under `TRITON_INTERPRET=1`. Installed SGLang files are never edited: `install()` (called from this
directory's sitecustomize.py, so in every SGLang process, the spawned scheduler and detokenizer too) applies each
patch right after its module is first imported. None of them is needed on a CUDA host; each only widens a
CPU-specific refusal or CUDA-only assumption:

- P1 `sglang/srt/arg_groups/speculative_hook.py:290-301` (`_handle_dflash`): an in-tree platform other than
  cuda/npu/xpu is refused ("DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'").
- P3 `sglang/srt/speculative/dflash_worker_v2.py:2481`: `batch.seq_lens.record_stream(...current_stream())`
  raises "unknown parameter type" for a CPU tensor and CPU stream.
- P4 `sglang/srt/model_executor/model_runner.py:1772` (`_extend_forward_kwargs`): `input_embeds.bfloat16()` is
  hard-coded; DFLASH feeds its drafter input_embeds, so a float32 model fails in F.linear (BFloat16 != float).
- P7 `sglang/kernels/ops/speculative/spec_tree.py` (`verify_tree_greedy_func`): calls sgl_kernel's
  `verify_tree_greedy_cpu`, which only SGLang's CPU kernel build has; routed to SGLang's Triton kernel.
- P8 `sglang/kernels/ops/attention/fla/layernorm_gated.py:212-219` (`_get_sm_count`, hybrid target only): asks
  `torch.cuda.get_device_properties` for the gated RMSNorm's launch shape; a CPU counts as one SM.
- P9 `sglang/srt/layers/attention/hybrid_linear_attn_backend.py:1601` (hybrid target, DFLASH/DDTREE only):
  `scatter_mamba_states_after_mtp_verify`'s kernels refuse CPU tensors; the same scatter runs in torch.

- P10 `sglang/srt/mem_cache/memory_pool.py:135` (`conv_window_dedup_enabled`): on CUDA, with DFLASH's top-k of 1,
  SGLang stores the per-step verify conv windows in a deduplicated, overlapping `as_strided` layout (safe for
  chains only); a CPU gets the dense one. The engine test runs CUDA's layout, so a tree verify on a hybrid
  target meets here what it meets on a GPU (the layout that made DDTREE's hybrid tree decode wrong tokens on
  the H200). Kernels and the scatter read windows through their strides; nothing else changes.

- P11 `sglang/srt/model_executor/model_runner.py:843` (`maybe_enable_batch_invariant_mode`): with
  --enable-deterministic-inference (what seeded sampling needs: SGLang fills `sampling_seed` only then) SGLang
  swaps in its batch-invariant CUDA/XPU kernels and refuses any other device; a CPU keeps its torch ops. The
  seeded sampler itself (`multinomial_with_seed`) is plain torch and runs unchanged, but for its hash (P12).
- P12 `sglang/kernels/ops/sampling/murmur_hash.py:112`: the seeded sampler's MurmurHash3 calls sgl_kernel's CPU
  build; the same hash in torch.

(P2, P5 and P6 of the exploration were only for the torch_native attention backend; CI runs triton, what opsctl
renders in production.)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

APPLIED: list[str] = []


def _patch_speculative_hook(module: ModuleType) -> None:
    """P1: inside speculative_hook only, `current_platform` answers as an out-of-tree platform that supports
    DFLASH, with the draft attention backends the in-tree path allows (DRAFT_ATTENTION_BACKEND_CHOICES)."""
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

    real = module.current_platform

    class CpuDFlashPlatform:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def is_out_of_tree(self) -> bool:
            return True

        def supports_speculative_algorithm(self, algorithm: str) -> bool:
            return algorithm == "DFLASH" or bool(real.supports_speculative_algorithm(algorithm))

        def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
            return backend in DRAFT_ATTENTION_BACKEND_CHOICES

    module.current_platform = CpuDFlashPlatform()
    APPLIED.append("P1")


def _patch_record_stream(_module: ModuleType) -> None:
    """P3: `Tensor.record_stream` is a no-op for CPU tensors (there is no other stream to synchronise with)."""
    import torch

    original = torch.Tensor.record_stream
    if getattr(original, "_ddtree_ci", False):
        return

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        if self.device.type == "cpu":
            return None
        return original(self, stream)  # type: ignore[no-any-return]

    record_stream._ddtree_ci = True  # type: ignore[attr-defined]
    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign]
    APPLIED.append("P3")


def _patch_model_runner(module: ModuleType) -> None:
    """P4: input_embeds reach the model in the runner's dtype (float32 here) instead of always bfloat16 (left as
    is when token-embedding replacements were scattered into them, which this path never has)."""
    runner = module.ModelRunner
    original = runner._extend_forward_kwargs

    def _extend_forward_kwargs(self: Any, forward_batch: Any, pp_proxy_tensors: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = original(self, forward_batch, pp_proxy_tensors)
        if forward_batch.input_embeds is not None and forward_batch.replace_embeds is None:
            kwargs["input_embeds"] = forward_batch.input_embeds.to(self.dtype)
        return kwargs

    runner._extend_forward_kwargs = _extend_forward_kwargs
    APPLIED.append("P4")
    enable_invariant = runner.maybe_enable_batch_invariant_mode

    def maybe_enable_batch_invariant_mode(self: Any) -> None:
        if str(self.device) != "cpu":
            enable_invariant(self)

    runner.maybe_enable_batch_invariant_mode = maybe_enable_batch_invariant_mode
    APPLIED.append("P11")


def _patch_spec_tree(module: ModuleType) -> None:
    """P7: on a CPU, `spec_tree.verify_tree_greedy_func` calls sgl_kernel's `verify_tree_greedy_cpu`, which only
    SGLang's CPU kernel build has; route it to SGLang's own Triton kernel (run by TRITON_INTERPRET=1), the one a
    GPU host runs. Used by the DDTREE tree worker's acceptance step."""
    triton_kernel = module.verify_tree_greedy_triton

    def verify_tree_greedy_cpu(
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
        triton_kernel(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, target_predict,
        )  # fmt: skip

    module.sgl_verify_tree_greedy_cpu = verify_tree_greedy_cpu
    APPLIED.append("P7")


def _patch_layernorm_gated(module: ModuleType) -> None:
    """P8: `sglang/kernels/ops/attention/fla/layernorm_gated.py:212-219` (`_get_sm_count`, used by
    `calc_rows_per_block` to size the Triton gated RMSNorm's row blocks, the hybrid target's Gated DeltaNet
    output norm) asks `torch.cuda.get_device_properties` for any non-XPU device; on a CPU it answers 1 (one
    "SM": a launch grid is only a loop for the interpreter, and the rows per block do not change the result)."""
    original = module._get_sm_count

    def _get_sm_count(device: Any) -> int:
        if getattr(device, "type", None) == "cpu":
            return 1
        return int(original(device))

    module._get_sm_count = _get_sm_count
    APPLIED.append("P8")


def _scatter_verified_rows(dst: Any, src: Any, dst_rows: Any, steps: Any, src_rows: Any) -> None:
    """For every request i with `steps[i] >= 0`: `dst[:, dst_rows[i]] = src[:, src_rows[i], steps[i]]` (all
    layers at once), `src_rows` defaulting to i: the semantics of SGLang's
    `fused_mamba_state_scatter_with_mask` / `fused_conv_window_scatter_with_mask`
    (`sglang/kernels/ops/mamba/mamba_state_scatter_triton.py:312,487`)."""
    import torch

    if steps.numel() == 0 or dst.numel() == 0:
        return
    if src_rows is None:
        src_rows = torch.arange(steps.shape[0], device=steps.device)
    valid = steps >= 0
    rows, at = src_rows[valid].long(), steps[valid].long()
    dst[:, dst_rows[valid].long()] = src[:, rows, at].to(dst.dtype)


def _patch_hybrid_linear_attn_backend(module: ModuleType) -> None:
    """P9: `sglang/srt/layers/attention/hybrid_linear_attn_backend.py:1601`
    (`update_mamba_state_after_mtp_verify`, after every DFLASH/DDTREE verify of a hybrid target) calls
    `scatter_mamba_states_after_mtp_verify` (`sglang/kernels/ops/mamba/mamba_state_scatter_triton.py:781`),
    whose kernels refuse non-CUDA/XPU tensors (`:343`, "only supports CUDA/XPU tensors"). For CPU caches the
    same scatter runs in torch: the accepted step's SSM state and conv windows become each request's state
    (and, when radix tracking asks, its track slot's); GPU tensors keep the Triton path."""
    original = module.scatter_mamba_states_after_mtp_verify

    def scatter_mamba_states_after_mtp_verify(
        mamba_caches: Any,
        state_indices_tensor: Any,
        last_correct_step_indices: Any,
        mamba_track_indices: Any,
        mamba_steps_to_track: Any,
        src_indices_raw: Any = None,
    ) -> None:
        if mamba_caches.temporal.device.type != "cpu":
            original(
                mamba_caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices,
                mamba_steps_to_track, src_indices_raw=src_indices_raw,
            )  # fmt: skip
            return
        targets = [(state_indices_tensor, last_correct_step_indices)]
        if mamba_track_indices is not None:
            targets.append((mamba_track_indices, mamba_steps_to_track))
        pairs = [(mamba_caches.temporal, mamba_caches.intermediate_ssm)]
        pairs += list(zip(mamba_caches.conv, mamba_caches.intermediate_conv_window, strict=True))
        for dst, src in pairs:
            for dst_rows, steps in targets:
                _scatter_verified_rows(dst, src, dst_rows, steps, src_indices_raw)

    module.scatter_mamba_states_after_mtp_verify = scatter_mamba_states_after_mtp_verify
    APPLIED.append("P9")


def _patch_memory_pool(module: ModuleType) -> None:
    """P10: the deduplicated conv-window layout CUDA gets (same conditions, minus "not on a CPU")."""
    original = module.conv_window_dedup_enabled

    def conv_window_dedup_enabled(is_npu: bool, is_cpu: bool, speculative_eagle_topk: Any, is_kda: bool) -> bool:
        return bool(original(is_npu, False, speculative_eagle_topk, is_kda))

    module.conv_window_dedup_enabled = conv_window_dedup_enabled
    APPLIED.append("P10")


def murmur_hash32_torch(seed: Any, positions: Any, col_indices: Any) -> Any:
    """SGLang's `murmur_hash32_kernel` (MurmurHash3 of the 64-bit seed, the 32-bit position and the 32-bit
    column) in torch int64 arithmetic: [n, m] uint32. Low 32 bits of products are exact under int64 wrap."""
    import torch

    mask = 0xFFFFFFFF

    def rotl(x: Any, r: int) -> Any:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix(h: Any, k: Any) -> Any:
        k = rotl((k * 0xCC9E2D51) & mask, 15)
        k = (k * 0x1B873593) & mask
        h = rotl(h ^ k, 13)
        return (h * 5 + 0xE6546B64) & mask

    seed = seed.to(torch.int64).view(-1, 1)
    pos = (positions.to(torch.int64) & mask).view(-1, 1)
    col = (col_indices.to(torch.int64) & mask).view(1, -1)
    h = torch.zeros((seed.shape[0], 1), dtype=torch.int64, device=seed.device)
    h = mix(h, seed & mask)
    h = mix(h, (seed >> 32) & mask)
    h = mix(h, pos)
    h = mix(h, col)  # [n, m]
    h = h ^ 16
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & mask
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & mask
    h = h ^ (h >> 16)
    return h.to(torch.uint32)


def _patch_murmur_hash(module: ModuleType) -> None:
    """P12 `sglang/kernels/ops/sampling/murmur_hash.py:112` (`murmur_hash32`): seeded sampling's noise (with
    --enable-deterministic-inference) calls sgl_kernel's `murmur_hash32_cpu` on a CPU, which only SGLang's CPU
    kernel build has; the same hash in torch (`murmur_hash32_torch`, checked against SGLang's Triton kernel in
    tests/runtime/test_sglang_engine.py). Baseline and DDTREE draw through it alike."""
    original = module.murmur_hash32

    def murmur_hash32(seed: Any, positions: Any, col_indices: Any) -> Any:
        if seed.device.type == "cpu":
            return murmur_hash32_torch(seed, positions, col_indices)
        return original(seed, positions, col_indices)

    module.murmur_hash32 = murmur_hash32
    APPLIED.append("P12")


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "sglang.kernels.ops.sampling.murmur_hash": _patch_murmur_hash,
    "sglang.srt.mem_cache.memory_pool": _patch_memory_pool,
    "sglang.srt.layers.attention.hybrid_linear_attn_backend": _patch_hybrid_linear_attn_backend,
    "sglang.kernels.ops.attention.fla.layernorm_gated": _patch_layernorm_gated,
    "sglang.kernels.ops.speculative.spec_tree": _patch_spec_tree,
    "sglang.srt.arg_groups.speculative_hook": _patch_speculative_hook,
    "sglang.srt.speculative.dflash_worker_v2": _patch_record_stream,
    "sglang.srt.model_executor.model_runner": _patch_model_runner,
}


class _PatchingLoader(importlib.abc.Loader):
    """Wraps a module's own loader; patches the module right after it has executed."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _PatchFinder(importlib.abc.MetaPathFinder):
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
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install() -> None:
    """Patch each module when it is first imported (or now, if it already is). Idempotent."""
    if any(isinstance(finder, _PatchFinder) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _PatchFinder())
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
