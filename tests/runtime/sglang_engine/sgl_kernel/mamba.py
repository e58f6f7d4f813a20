"""`sgl_kernel.mamba`: the Python-level CPU ops SGLang 0.5.23 imports for Gated DeltaNet layers on a CPU
(`sglang/srt/layers/attention/linear/gdn_backend.py:184`, `.../linear/kernels/gdn_triton.py:28`), the two conv1d ops
served by SGLang's own Triton kernels, the ones GPU hosts run (see triton_routes.py; the call sites are shared
with the GPU path, so every call arrives with the Triton kernel's own arguments and is passed through unchanged),
the chunked delta rule in pure torch (SGLang's Triton one refuses float32)."""

from __future__ import annotations

import itertools
from typing import Any

import torch


def causal_conv1d_fn_cpu(*args: Any, **kwargs: Any) -> torch.Tensor:
    """`gdn_backend.py:186` (`causal_conv1d_fn`, prefill/extend): the varlen causal depthwise conv1d over each
    request's new tokens, seeded from and writing back the indexed conv state, SiLU applied. Routed to
    `sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_fn` (Triton)."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn

    out: torch.Tensor = causal_conv1d_fn(*args, **kwargs)
    return out


def causal_conv1d_update_cpu(*args: Any, **kwargs: Any) -> torch.Tensor:
    """`gdn_backend.py:187` (`causal_conv1d_update`, decode and target verify): one conv step per token from
    the indexed conv state (in place, or into the intermediate conv-window buffer for verify). Routed to
    `sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update` (Triton)."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    out: torch.Tensor = causal_conv1d_update(*args, **kwargs)
    return out


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dim, as SGLang's `fla/l2norm.py` (`l2norm_fwd`, eps 1e-6)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule_cpu(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
) -> tuple[torch.Tensor, None, None]:
    """`gdn_triton.py:30,203` (`TritonGDNKernel.extend`, prefill of the Gated DeltaNet layers): the gated delta
    rule over each request's new tokens, computed token by token (the recurrent form; the chunked kernel is the
    same recurrence reassociated). Inputs are packed varlen, batch 1: q, k (1, T, Hk, K), v (1, T, Hv, V),
    g (log decay) and beta (1, T, Hv); sequence i is rows `cu_seqlens[i]:cu_seqlens[i+1]`, its state
    `initial_state[initial_state_indices[i]]` of shape (Hv, V, K) (SGLang's layout). Per token, in float32:
    `S *= exp(g)`, `S += outer(beta * (v - S @ k), k)`, `o = scale * S @ q`, with q, k L2-normalised first
    when `use_qk_l2norm_in_kernel` and k heads shared by `Hv // Hk` value heads each (head h uses k head
    `h // (Hv // Hk)`), `scale` defaulting to `K ** -0.5`. The final states are written back into
    `initial_state` (when `inplace_update`). Returns (o (1, T, Hv, V) in q's dtype, None, None) like the
    Triton function's (o, None, h); h, the per-64-token-chunk states, only feeds the Mamba radix cache's state
    tracking, which these runs disable (`disable_radix_cache`).

    Pure torch, not SGLang's Triton `fla/chunk.py:chunk_gated_delta_rule`: that one refuses float32 inputs
    (`chunk.py:216`, "does not support float32"), and this test runs the model in float32."""
    assert not head_first and q.shape[0] == 1, "packed varlen (batch 1, head_first=False) only"
    if scale is None:
        scale = k.shape[-1] ** -0.5
    qf, kf, vf = q[0].float(), k[0].float(), v[0].float()
    if use_qk_l2norm_in_kernel:
        qf, kf = _l2norm(qf), _l2norm(kf)
    group = vf.shape[1] // kf.shape[1]
    qf, kf = qf.repeat_interleave(group, dim=1), kf.repeat_interleave(group, dim=1)  # (T, Hv, K)
    gf, betaf = g[0].float(), beta[0].float()  # (T, Hv)
    out = torch.empty(vf.shape, dtype=torch.float32, device=v.device)  # (T, Hv, V)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    for seq, (start, end) in enumerate(itertools.pairwise(bounds)):
        slot = int(initial_state_indices[seq])
        state = initial_state[slot].float().clone()  # (Hv, V, K)
        for t in range(start, end):
            state = state * torch.exp(gf[t])[:, None, None]
            predicted = torch.einsum("hvk,hk->hv", state, kf[t])
            delta = betaf[t][:, None] * (vf[t] - predicted)
            state = state + delta[:, :, None] * kf[t][:, None, :]
            out[t] = scale * torch.einsum("hvk,hk->hv", state, qf[t])
        if inplace_update:
            initial_state[slot] = state.to(initial_state.dtype)
    return out.to(q.dtype)[None], None, None
