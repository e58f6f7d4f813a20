"""The `sgl_kernel` ops SGLang 0.5.23's CUDA path may call for a dense Qwen3 or hybrid Qwen3.5 target with DFLASH
(and DDTREE) on the Triton attention backend, in plain torch. Each keeps the real op's argument order, its
in-place / returning contract and its arithmetic (float32 inside, one rounding to the tensor's dtype at the end,
as sgl_kernel's (flashinfer's) kernels do); tests/runtime/test_gpu_standin.py checks each against SGLang's own
torch implementation (`forward_native`) of the same layer.

These are reference-speed kernels: several torch launches where sgl_kernel has one. Timings taken with them are
not a production host's (dev/sglang_gpu/README.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "rmsnorm",
    "rotary_embedding",
    "silu_and_mul",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "weak_ref_tensor",
]


def _normed(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_bias: float) -> torch.Tensor:
    """float32 `x * rsqrt(mean(x^2) + eps) * (weight + weight_bias)` over the last dim (x already float32)."""
    rms_rcp = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return x * rms_rcp * (weight.float() + weight_bias)


def _into(out: torch.Tensor | None, value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`value` cast to `like`'s dtype, written into `out` when given (returned either way)."""
    if out is None:
        return value.to(like.dtype)
    out.copy_(value)
    return out


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """`sgl_kernel.rmsnorm`: returns (or writes into `out`) `input * rsqrt(mean(input^2) + eps) * weight`, computed
    in float32, rounded once to input's dtype. Call site: `srt/layers/layernorm.py:645` (RMSNorm.forward_cuda);
    native: `:828`."""
    return _into(out, _normed(input.float(), weight, eps, 0.0), input)


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """`sgl_kernel.fused_add_rmsnorm`, in place, returns None: with `s = input + residual` in float32,
    `residual := s` (rounded to residual's dtype) and `input := rmsnorm(s) * weight` (normalised from the unrounded
    float32 sum, rounded once to input's dtype). The call site (`srt/layers/layernorm.py:638`) then returns
    `(x, residual)`, the same tensors; native: `:828` (residual path)."""
    s = input.float() + residual.float()
    residual.copy_(s)
    input.copy_(_normed(s, weight, eps, 0.0))


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """`sgl_kernel.gemma_rmsnorm`: like `rmsnorm` with the Gemma weight `(1 + weight)`. Call site:
    `srt/layers/layernorm.py:1146` (GemmaRMSNorm._forward_impl); native: `:1152`."""
    return _into(out, _normed(input.float(), weight, eps, 1.0), input)


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """`sgl_kernel.gemma_fused_add_rmsnorm`, in place, returns None: `fused_add_rmsnorm` with `(1 + weight)`. Call
    site: `srt/layers/layernorm.py:1141`; native: `:1152` (which adds in the tensors' dtype before upcasting: equal
    in float32, within one rounding in bfloat16)."""
    s = input.float() + residual.float()
    residual.copy_(s)
    input.copy_(_normed(s, weight, eps, 1.0))


def _act_and_mul(act: str, input: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    d = input.shape[-1] // 2
    x, y = input[..., :d].float(), input[..., d:].float()
    gated = F.silu(x) if act == "silu" else F.gelu(x, approximate="tanh" if act == "gelu_tanh" else "none")
    if out is None:
        out = torch.empty(*input.shape[:-1], d, dtype=input.dtype, device=input.device)
    out.copy_(gated * y)
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """`sgl_kernel.silu_and_mul`: `silu(x[..., :d]) * x[..., d:]` (d = last dim / 2) in float32, rounded once;
    written into `out` (shape [..., d]) when given, returned either way. Call site: `srt/layers/activation.py:97-98`
    (`_act_and_mul(..., input, out)`); native: `:141`."""
    return _act_and_mul("silu", input, out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    """`sgl_kernel.gelu_and_mul`: exact (erf) GELU of the first half times the second; as `silu_and_mul`.
    `srt/layers/activation.py:60,101`; native: `:242` (GeluAndMul, approximate="none")."""
    return _act_and_mul("gelu", input, out)


def gelu_tanh_and_mul(
    input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
) -> torch.Tensor:
    """`sgl_kernel.gelu_tanh_and_mul`: tanh-approximated GELU of the first half times the second.
    `srt/layers/activation.py:61,104`; native: `:242` (approximate="tanh")."""
    return _act_and_mul("gelu_tanh", input, out)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """`sgl_kernel.rotary_embedding` (the vLLM-style op; `srt/layers/rotary_embedding/base.py:136` imports it on
    ROCm, CUDA uses the JIT op of the same signature from `sglang.kernels.ops.attention.rope`), in place, returns
    None: for token t at position p, the first `rot = cos_sin_cache.shape[1]` channels of every head of
    query / key (shape [tokens, heads * head_size] or [tokens, heads, head_size]) are rotated by
    `cos, sin = cos_sin_cache[p].chunk(2)`; neox style pairs channel i with i + rot/2, GPT-J style pairs 2i with
    2i + 1. Native: `base.py:321` (forward_native)."""
    cos_sin = cos_sin_cache.index_select(0, positions.flatten().long()).float()  # [T, rot]
    rot = cos_sin.shape[-1]
    cos, sin = cos_sin[:, None, : rot // 2], cos_sin[:, None, rot // 2 :]  # [T, 1, rot/2]
    for x in (query, key):
        if x is None:
            continue
        heads = x.view(x.shape[0], -1, head_size)  # [T, H, head_size], a view of x
        part = heads[..., :rot].float()
        if is_neox:
            x1, x2 = part[..., : rot // 2], part[..., rot // 2 :]
            heads[..., :rot] = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
        else:
            x1, x2 = part[..., 0::2], part[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
            heads[..., :rot] = rotated.to(x.dtype)


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """`sgl_kernel.top_k_renorm_prob` (`srt/layers/sampler.py:40,408,452`, flashinfer sampling backend only):
    SGLang's own Triton version, `sglang.kernels.ops.sampling.renorm_triton.top_k_renorm_probs_triton`."""
    from sglang.kernels.ops.sampling.renorm_triton import top_k_renorm_probs_triton

    renormed: torch.Tensor = top_k_renorm_probs_triton(probs, top_k)
    return renormed


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """`sgl_kernel.top_p_renorm_prob` (`srt/layers/sampler.py:40,409,456`): SGLang's Triton
    `renorm_triton.top_p_renorm_probs_triton`."""
    from sglang.kernels.ops.sampling.renorm_triton import top_p_renorm_probs_triton

    renormed: torch.Tensor = top_p_renorm_probs_triton(probs, top_p)
    return renormed


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """`sgl_kernel.weak_ref_tensor` (`srt/model_executor/runner_backend_utils/weak_ref_tensor.py:8`, CUDA-graph
    outputs): the real op returns a tensor over the same memory that does not keep it alive. Plain torch cannot
    make a non-owning tensor, so this returns a view that does (same data, same shape and strides): correct, it only
    keeps captured graphs' output buffers allocated a little longer."""
    return tensor.detach()
