"""Torch stand-in for `sgl_kernel`, SGLang's binary CUDA kernel package, on the H200 dev machine (torch 2.11),
where the real package cannot load (/work/shared/notes/sglang-on-h200.md, "What cannot travel").

Not for production and never imported by opsctl or ddtree: dev/sglang_gpu/run.sh puts this directory first on
PYTHONPATH for SGLang's processes only. On a host with the real `sgl_kernel`, leave it off the path.

What SGLang 0.5.23's CUDA path imports from here (found by importing the engine, scheduler, model runner, the
dense Qwen3 and hybrid Qwen3.5 models, DFLASH's worker, the Triton attention and GDN backends and the sampler with
a recording stand-in, then reading every call site):

- called (with `SGLANG_FORCE_FUSED_OP_BACKEND=torch`, most of these are only imported: RMSNorm, GemmaRMSNorm,
  SiluAndMul and RotaryEmbedding are `BaseFusedOp`s and run their `forward_native`): `rmsnorm`,
  `fused_add_rmsnorm`, `gemma_rmsnorm`, `gemma_fused_add_rmsnorm` (`srt/layers/layernorm.py:102`), `silu_and_mul`,
  `gelu_and_mul`, `gelu_tanh_and_mul` (`srt/layers/activation.py:60-62`), `top_k_renorm_prob`,
  `top_p_renorm_prob` (`srt/layers/sampler.py:40`), `weak_ref_tensor`
  (`srt/model_executor/runner_backend_utils/weak_ref_tensor.py:8`, CUDA graphs), `rotary_embedding` (ROCm's
  entry; on CUDA RoPE is JIT, `srt/layers/rotary_embedding/base.py:45,134`), `utils.is_arch_support_pdl`
  (`srt/layers/attention/triton_backend.py:71,340`). All in `ops.py`, each with sgl_kernel's argument order and
  in-place / returning semantics.
- imported at module level but never called for these models: `moe_sum`, `moe_sum_reduce`, `int8_scaled_mm`,
  `quantization.*` (gguf), `kvcacheio.*` (host KV cache): any name not in `ops.py` resolves to a function that
  raises NotImplementedError naming the op, so imports succeed and a call fails loudly.
- `sgl_kernel.scalar_type` is not importable on purpose: `srt/layers/quantization/utils.py:27` catches the
  ImportError and uses SGLang's own mock scalar types (a stub module would break `scalar_types.uint4b8`).
  `sgl_kernel.allreduce` likewise (`custom_all_reduce_ops.py:21` then disables custom all-reduce; TP is 1).
- `torch.ops.sgl_kernel` is left empty: SGLang probes it (`srt/utils/common.py:356`, AMX) and must find nothing.
"""

from __future__ import annotations

from typing import Any

from . import ops
from ._missing import missing

# SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 skips the check (`srt/entrypoints/engine.py:1948-1966`); the value still
# parses as a version and is at least what SGLang 0.5.23 asks for, should anything compare it.
__version__ = "0.4.10+torch.standin"

PROVIDED = frozenset(ops.__all__)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name in PROVIDED:
        return getattr(ops, name)
    return missing(f"sgl_kernel.{name}")
