"""The CPU `sgl_kernel` ops SGLang 0.5.23 calls for a hybrid Qwen3.5 target (Gated DeltaNet + gated attention),
each served by SGLang's own Triton kernel, the one a GPU host runs (under `TRITON_INTERPRET=1` here), except
one that Triton cannot run at the tiny model's head size (pure torch, reason in its docstring).

On a CPU, SGLang swaps these Triton kernels for `sgl_kernel` CPU ops at module level (`if _is_cpu:` /
`elif is_cpu():` blocks), while the call sites stay shared with the GPU path: every op below is called with the
Triton kernel's own arguments, so each route is that kernel with the CPU op's calling convention. The Triton
modules are imported on first call (not at import: SGLang imports sgl_kernel long before its kernels).

Not served: `fused_rmsnorm_gated_cpu` and `fused_input_proj_cpu`, which SGLang calls only on an AMX CPU (its
`_use_cpu` / `use_intel_amx_backend` paths), where the dense target would need other ops too.

`install()` puts the `torch.ops.sgl_kernel.*_cpu` names on torch's op namespace object (SGLang looks them up as
attributes at import time, `torch.ops.sgl_kernel.NAME`); the Python-level ones (`sgl_kernel.mamba`) are in
`mamba.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Tensor = torch.Tensor


def fused_sigmoid_mul_cpu(x: Tensor, gate: Tensor) -> None:
    """`sglang/srt/models/qwen3_5.py:284-290` (`fused_sigmoid_mul`, the gated-attention output gate):
    in place, `x := x * sigmoid(gate)`; `gate` may be the 3-D strided (tokens, heads, head_dim) view of a 2-D
    `x`. Routed to `sglang.kernels.ops.elementwise.elementwise.fused_sigmoid_mul(inplace=True)`."""
    from sglang.kernels.ops.elementwise.elementwise import fused_sigmoid_mul

    fused_sigmoid_mul(x, gate, inplace=True)


def fused_qk_gemma_rmsnorm_cpu(
    q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, head_dim: int
) -> tuple[Tensor, Tensor]:
    """`sglang/srt/models/qwen3_5.py:292,1446` (`_apply_qk_norm`): Gemma RMSNorm (`x / rms(x) * (1 + w)`) of
    every head_dim row of q and of k; returns (q rows, k rows), contiguous (rows, head_dim). Routed to
    `sglang.srt.models.utils.fused_qk_gemma_rmsnorm` (Triton)."""
    from sglang.srt.models.utils import fused_qk_gemma_rmsnorm

    out: tuple[Tensor, Tensor] = fused_qk_gemma_rmsnorm(q, k, q_weight, k_weight, eps, head_dim)
    return out


def fused_qk_gemma_rmsnorm_with_gate_cpu(
    q_gate: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, head_dim: int, num_heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    """`sglang/srt/models/qwen3_5.py:293,1527` (`forward_prepare_fused_gate`): splits the per-head interleaved
    `[q_h, gate_h]` buffer, Gemma-RMSNorms q and k rows; returns (q, k, gate) rows, contiguous. Routed to
    `sglang.srt.models.utils.fused_qk_gemma_rmsnorm_with_gate` (Triton)."""
    from sglang.srt.models.utils import fused_qk_gemma_rmsnorm_with_gate

    out: tuple[Tensor, Tensor, Tensor] = fused_qk_gemma_rmsnorm_with_gate(
        q_gate, k, q_weight, k_weight, eps, head_dim, num_heads
    )
    return out


def fused_qkvzba_split_reshape_cat_contiguous_cpu(
    mixed_qkvz: Tensor, mixed_ba: Tensor, num_heads_qk: int, num_heads_v: int, head_qk: int, head_v: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`sglang/srt/models/qwen3_5.py:296,1046` (`Qwen3_5GatedDeltaNet.forward`): splits the contiguous
    projections `mixed_qkvz = [all_q | all_k | all_v | all_z]` (rows = tokens) and `mixed_ba = [all_b | all_a]`
    into (mixed_qkv `[all_q | all_k | all_v]` (tokens, 2*Hqk*Dqk + Hv*Dv), z (tokens, Hv, Dv), b (tokens, Hv),
    a (tokens, Hv)), all fresh contiguous tensors. Pure torch, not SGLang's Triton kernel
    (`sglang/kernels/ops/attention/triton_gdn_fused_proj.py:272`): that one takes `tl.arange(0, head_qk)`,
    which Triton only allows for a power-of-two head size; the tiny model's is 24 (production's: 128)."""
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    tokens = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim : qkv_dim + num_heads_v * head_v].reshape(tokens, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v : 2 * num_heads_v].contiguous()
    return mixed_qkv, z, b, a


def fused_gdn_gating_cpu(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """`sglang/srt/layers/attention/linear/gdn_backend.py:188,946,1348`: GDN gating, `g = -exp(A_log) *
    softplus(a + dt_bias)` and `beta = sigmoid(b)`, each (1, tokens, heads) float32. Routed to
    `sglang.kernels.ops.attention.linear.fused_gdn_gating.fused_gdn_gating` (Triton)."""
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating

    out: tuple[Tensor, Tensor] = fused_gdn_gating(A_log, a, b, dt_bias)
    return out


def fused_sigmoid_gating_delta_rule_update_cpu(**kwargs: Any) -> Tensor:
    """`sglang/srt/layers/attention/linear/kernels/gdn_triton.py:31-33` (`TritonGDNKernel.decode` and
    `.target_verify`): gating plus one recurrent gated-delta-rule step per token from the indexed SSM state
    (in place, or into the intermediate-state buffer for verify). Routed to
    `sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent.fused_sigmoid_gating_delta_rule_update`
    (Triton), called with the same keyword arguments."""
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    out: Tensor = fused_sigmoid_gating_delta_rule_update(**kwargs)
    return out


OPS: dict[str, Callable[..., Any]] = {
    fn.__name__: fn
    for fn in (
        fused_sigmoid_mul_cpu,
        fused_qk_gemma_rmsnorm_cpu,
        fused_qk_gemma_rmsnorm_with_gate_cpu,
        fused_qkvzba_split_reshape_cat_contiguous_cpu,
        fused_gdn_gating_cpu,
        fused_sigmoid_gating_delta_rule_update_cpu,
    )
}


def install() -> None:
    """Expose OPS as `torch.ops.sgl_kernel.<name>` (attributes of torch's cached namespace object; no schema is
    registered, so they are plain Python calls, which is all SGLang's call sites need)."""
    namespace = torch.ops.sgl_kernel
    for name, fn in OPS.items():
        setattr(namespace, name, fn)
