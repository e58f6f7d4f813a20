"""Exact tree verify through Gated DeltaNet (GDN) layers, and the naive flat-order `unsafe` path.

In a flat forward a recurrent layer advances its state in node order, so a node starts from its previous
sibling's state and its causal conv window mixes in non-ancestors. Here every node starts from its *parent's*
state and takes its conv window from its ancestors:

- the per-token projections (qkv, z, a, b) run for all N nodes at once;
- the causal conv (kernel K = 4) of node i reads its own input and its K-1 nearest ancestors', reaching into
  the committed conv state near the root (`GDNPlan.conv_index`, a gather, no loop);
- the delta-rule recurrence, two exact methods (`GDNMethod`):
  `chunk` (default): the chunked (WY) form of the delta rule with the causal mask replaced by the ancestor
  mask. Along one path the chunk form is the sequential recurrence rewritten; restricting every row to the
  node's ancestors makes row i exactly its own path's computation, and node ids are parent-before-child, so
  the system stays unit lower-triangular. A handful of batched matmuls and one triangular solve per layer,
  O(N^2) per head, no per-node state is ever materialised.
  `depth`: depth by depth, the nodes of depth d start from their parents' states (the previous depth's states
  gathered by parent slot): one batched step per depth, width x H x d_k x d_v floats alive per step. Kept as
  the direct transcription of the recurrence, for tests and for the benchmark.

The tree forward does not touch the cache. It keeps, per layer, each node's pre-conv input and its recurrence
inputs (k, v, g, beta: N x (C + H(d_k + d_v + 2)) floats). `commit_gdn` rebuilds the committed state by
replaying only the accepted path's steps (tau steps per layer), which costs far less memory than keeping
every node's recurrent state until the walk is done.

`unsafe` runs the same code with the flat chain (parent of node i = node i - 1): what a naive tree verify does.
It exists to measure the error; its commit still replays the accepted path exactly.

The layer forward is swapped per call by `tree_gdn` (a context manager that restores it on exit).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree.config import HybridMode

if TYPE_CHECKING:
    from ddtree.hf_compat import HFCompat

__all__ = [
    "GDNMethod", "GDNPlan", "GDNStash", "HybridMode", "commit_gdn", "delta_step", "find_gdn_layers",
    "gdn_recurrence", "tree_gdn",
]  # fmt: skip


GDNLayer = Any  # transformers' Qwen3_5GatedDeltaNet, duck-typed (its attributes are the same in 5.17 and 5.24)

_GDN_ATTRS = ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "conv1d", "A_log", "dt_bias", "norm", "out_proj")


def find_gdn_layers(model: nn.Module) -> list[GDNLayer]:
    """The Gated DeltaNet modules of a transformers Qwen3.5/3.6 model, in layer order."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    for m in layers:
        missing = [a for a in _GDN_ATTRS if not hasattr(m, a)]
        if missing:
            raise TypeError(f"unsupported GatedDeltaNet layout {type(m).__name__}: missing {missing}")
    return sorted(layers, key=lambda m: int(m.layer_idx))


class GDNMethod(StrEnum):
    CHUNK = "chunk"  # ancestor-masked chunked form: one triangular solve per layer
    DEPTH = "depth"  # one recurrent step per depth, from the parents' states


@dataclass(frozen=True)
class GDNPlan:
    """Index math for one tree, shared by every GDN layer (pure tensors, built once per verify).

    The recurrence visits nodes group by group (a group = one depth; one node per group when flat). Nodes are
    permuted so every group is a contiguous slice (`order`), which keeps the per-depth loop free of gathers
    except the one that fetches the parents' states (`parent_slot`)."""

    parents: Tensor  # [N] parent used by the recurrence (tree parents, or i - 1 when flat)
    order: Tensor  # [N] node ids, group after group
    inverse: Tensor  # [N] position of node i in `order`
    sizes: tuple[int, ...]  # nodes per group
    parent_slot: tuple[Tensor, ...]  # per group after the first: [W] its nodes' parents' index in the previous group
    conv_index: Tensor  # [N, K] rows into [conv_state (K cols) | nodes (N)], oldest first, self last
    ancestors: Tensor  # [N, N] bool, [i, j] = j is i or an ancestor of i (lower-triangular: parents first)
    method: GDNMethod = GDNMethod.CHUNK

    @classmethod
    def build(
        cls,
        parents: Tensor,
        depth_groups: Sequence[Tensor],
        conv_kernel: int,
        flat: bool,
        method: GDNMethod = GDNMethod.CHUNK,
    ) -> GDNPlan:
        n = parents.shape[0]
        dev = parents.device
        if flat:
            parents = torch.arange(n, device=dev) - 1
            depth_groups = tuple(torch.arange(i, i + 1, device=dev) for i in range(n))
        groups = tuple(g.to(dev) for g in depth_groups)
        slot = torch.empty(n, dtype=torch.long, device=dev)  # position of each node inside its group
        for g in groups:
            slot[g] = torch.arange(g.shape[0], device=dev)
        order = torch.cat(groups)
        k = conv_kernel
        # ext rows: 0..K-1 the committed conv state (oldest first), K + i the tree node i.
        # up[r] = the row one step back in time from row r along the node's ancestry.
        state_up = torch.arange(k, device=dev) - 1  # state row r -> r - 1 (row 0 is never walked past)
        node_up = torch.where(parents >= 0, parents + k, torch.full_like(parents, k - 1))
        up = torch.cat([state_up.clamp(min=0), node_up])  # [K + N]
        cols = [torch.arange(n, device=dev) + k]  # self
        for _ in range(k - 1):
            cols.append(up[cols[-1]])
        conv_index = torch.stack(cols[::-1], dim=1)  # [N, K] oldest first
        ancestors = torch.eye(n, dtype=torch.bool, device=dev)
        for g in groups[1:]:  # a node's ancestors are its parent's, plus itself; groups are parent-first
            ancestors[g] |= ancestors[parents[g]]
        return cls(
            parents=parents,
            order=order,
            inverse=torch.argsort(order),
            sizes=tuple(int(g.shape[0]) for g in groups),
            parent_slot=tuple(slot[parents[g]] for g in groups[1:]),
            conv_index=conv_index,
            ancestors=ancestors,
            method=method,
        )


@dataclass(frozen=True)
class GDNStash:
    """Per-node inputs of one GDN layer, kept from verify to commit."""

    mixed: Tensor  # [N, C] pre-conv qkv projections (what the conv state stores)
    key: Tensor  # [N, H_v, d_k] fp32, l2-normalised
    value: Tensor  # [N, H_v, d_v] fp32
    g: Tensor  # [N, H_v] fp32 log-decay
    beta: Tensor  # [N, H_v] fp32


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    # same formula as transformers' (and FLA's) l2norm
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_step(state: Tensor, key: Tensor, value: Tensor, g: Tensor, beta: Tensor) -> Tensor:
    """One gated delta-rule step for M independent rows (op order as transformers' recurrent kernel).

    state: [M, H, d_k, d_v]; key: [M, H, d_k]; value: [M, H, d_v]; g, beta: [M, H] -> new state."""
    state = state * g.exp()[..., None, None]
    kv_mem = (state * key[..., None]).sum(dim=-2)  # [M, H, d_v]
    delta = (value - kv_mem) * beta[..., None]
    return state + key[..., None] * delta[..., None, :]


def _gdn_tree_forward(
    mod: GDNLayer,
    plan: GDNPlan,
    compat: HFCompat,
    stashes: dict[int, GDNStash],
    hidden_states: Tensor,  # [1, N, hidden]
    cache: Any = None,
    cache_params: Any = None,
    attention_mask: Tensor | None = None,
    **_: Any,
) -> Tensor:
    cache = cache if cache is not None else cache_params
    if cache is None:
        raise RuntimeError("tree verify through a GDN layer needs the committed cache")
    bsz, n, _h = hidden_states.shape
    if bsz != 1:
        raise ValueError("tree verify supports batch size 1")
    x = hidden_states[0]  # [N, hidden]
    dtype = x.dtype
    conv_state, rec_state = compat.gdn_state(cache, mod.layer_idx)  # [1, C, K], [1, H_v, d_k, d_v]

    mixed = mod.in_proj_qkv(x)  # [N, C]
    z = mod.in_proj_z(x).reshape(n, -1, mod.head_v_dim)  # [N, H_v, d_v]
    b = mod.in_proj_b(x)  # [N, H_v]
    a = mod.in_proj_a(x)  # [N, H_v]

    # causal conv over each node's ancestry: ext rows = [conv_state | nodes]
    ext = torch.cat([conv_state[0].transpose(0, 1).to(mixed.dtype), mixed], dim=0)  # [K + N, C]
    windows = ext[plan.conv_index]  # [N, K, C]
    weight = mod.conv1d.weight.squeeze(1).float()  # [C, K]; accumulate in fp32 like the conv kernels
    conv = (windows.float() * weight.transpose(0, 1)[None]).sum(dim=1)  # [N, C]
    if mod.conv1d.bias is not None:
        conv = conv + mod.conv1d.bias.float()
    conv = _act(mod.activation)(conv).to(dtype)

    q, k, v = torch.split(conv, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
    q = q.reshape(n, -1, mod.head_k_dim)
    k = k.reshape(n, -1, mod.head_k_dim)
    v = v.reshape(n, -1, mod.head_v_dim)
    rep = mod.num_v_heads // mod.num_k_heads
    if rep > 1:
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    beta = b.sigmoid().float()  # [N, H_v]
    g = (-mod.A_log.float().exp() * F.softplus(a.float() + mod.dt_bias)).float()  # [N, H_v]
    q = _l2norm(q.float()) * (q.shape[-1] ** -0.5)  # [N, H_v, d_k]
    k = _l2norm(k.float())
    v = v.float()

    core = gdn_recurrence(plan, q, k, v, g, beta, rec_state[0].float())  # [N, H_v, d_v]
    stashes[int(mod.layer_idx)] = GDNStash(mixed=mixed, key=k, value=v, g=g, beta=beta)

    out = mod.norm(core.to(dtype).reshape(-1, mod.head_v_dim), z.reshape(-1, mod.head_v_dim))
    result: Tensor = mod.out_proj(out.reshape(1, n, -1))  # [1, N, hidden]
    return result


def gdn_recurrence(plan: GDNPlan, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state0: Tensor) -> Tensor:
    """Every node's delta-rule output, each from its own root-to-node path, by the plan's method.

    q (scaled), k (l2-normalised): [N, H, d_k]; v: [N, H, d_v]; g (log-decay), beta: [N, H]; state0: the
    committed state [H, d_k, d_v]; all fp32 -> [N, H, d_v]."""
    method = _tree_recurrence_chunk if plan.method is GDNMethod.CHUNK else _tree_recurrence_depth
    return method(plan, q, k, v, g, beta, state0)


def _tree_recurrence_depth(
    plan: GDNPlan, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state0: Tensor
) -> Tensor:
    """Outputs of every node, depth by depth from the parents' states.

    q, k: [N, H, d_k]; v: [N, H, d_v]; g, beta: [N, H]; state0: [H, d_k, d_v] -> [N, H, d_v]."""
    qo, ko, vo = q[plan.order], k[plan.order], v[plan.order]  # group slices become contiguous
    decay, bo = g[plan.order].exp()[..., None, None], beta[plan.order][..., None]
    outs = []
    state = state0[None]  # [1, H, d_k, d_v], the root's parent state
    lo = 0
    for i, w in enumerate(plan.sizes):
        hi = lo + w
        if i:
            state = state[plan.parent_slot[i - 1]]  # [W, H, d_k, d_v], each node's parent state
        # one delta-rule step, the op order of transformers' recurrent kernel (see delta_step)
        state = state * decay[lo:hi]
        delta = (vo[lo:hi] - (state * ko[lo:hi, ..., None]).sum(dim=-2)) * bo[lo:hi]
        state = state + ko[lo:hi, ..., None] * delta[..., None, :]
        outs.append((state * qo[lo:hi, ..., None]).sum(dim=-2))  # [W, H, d_v]
        lo = hi
    return torch.cat(outs)[plan.inverse]  # back in node order


def _tree_recurrence_chunk(
    plan: GDNPlan, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state0: Tensor
) -> Tensor:
    """Outputs of every node from the ancestor-masked chunked form of the gated delta rule.

    Along node t's path (ancestors j, then t), with G_t the path's summed log-decay and S0 the committed state,
    the step `S = g S; u = beta (v - S^T k); S += k u^T` unrolls to
        u_t = beta_t (v_t - e^{G_t} S0^T k_t - sum_{j < t on the path} e^{G_t - G_j} (k_t . k_j) u_j)
        o_t = e^{G_t} S0^T q_t + sum_{j <= t on the path} e^{G_t - G_j} (q_t . k_j) u_j
    i.e. a unit lower-triangular system over the strict-ancestor mask. Shapes as `_tree_recurrence_depth`."""
    anc = plan.ancestors  # [N, N]
    strict = anc & ~torch.eye(anc.shape[0], dtype=torch.bool, device=anc.device)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, N, d]
    gh, bh = g.transpose(0, 1), beta.transpose(0, 1)  # [H, N]
    cum = gh @ anc.to(gh.dtype).T  # [H, N] log-decay summed over each node's path (itself included)
    gap = cum[:, :, None] - cum[:, None, :]  # [H, N, N] G_t - G_j
    decay = torch.where(anc, gap, torch.full_like(gap, float("-inf"))).exp()  # 0 off the path, no overflow
    scale = cum.exp()[..., None]  # [H, N, 1]
    a = (kh @ kh.transpose(1, 2)) * decay * strict * bh[..., None]  # [H, N, N], zero diagonal
    rhs = bh[..., None] * (vh - scale * (kh @ state0))  # [H, N, d_v]
    u = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)  # (I + a) u = rhs
    out: Tensor = scale * (qh @ state0) + ((qh @ kh.transpose(1, 2)) * decay) @ u  # [H, N, d_v]
    return out.transpose(0, 1)


def _act(name: str) -> Any:
    from transformers.activations import ACT2FN

    return ACT2FN[name]


@contextmanager
def tree_gdn(layers: Sequence[GDNLayer], plan: GDNPlan, compat: HFCompat) -> Iterator[dict[int, GDNStash]]:
    """Within the block, every GDN layer runs the tree forward of `plan`; the original forward comes back on exit.

    Yields the dict that collects each layer's `GDNStash` (filled during the forward)."""
    stashes: dict[int, GDNStash] = {}
    saved: list[tuple[GDNLayer, Any]] = []
    try:
        for mod in layers:
            saved.append((mod, mod.__dict__.get("forward")))
            mod.forward = functools.partial(_gdn_tree_forward, mod, plan, compat, stashes)
        yield stashes
    finally:
        for mod, previous in saved:
            if previous is None:
                del mod.forward
            else:
                mod.forward = previous


def commit_gdn(
    layers: Sequence[GDNLayer],
    stashes: dict[int, GDNStash],
    path: Tensor,  # [A] accepted node ids, root first
    cache: Any,
    compat: HFCompat,
) -> None:
    """Install the accepted path's final conv and recurrent state in every GDN layer by replaying its steps."""
    for mod in layers:
        idx = int(mod.layer_idx)
        st = stashes[idx]
        conv_state, rec_state = compat.gdn_state(cache, idx)  # [1, C, K], [1, H_v, d_k, d_v]
        kernel = conv_state.shape[-1]
        inputs = st.mixed[path].transpose(0, 1)[None].to(conv_state.dtype)  # [1, C, A]
        new_conv = torch.cat([conv_state, inputs], dim=-1)[..., -kernel:]  # [1, C, K]
        state = rec_state.float()
        for node in path.tolist():
            state = delta_step(state, st.key[node][None], st.value[node][None], st.g[node][None], st.beta[node][None])
        compat.set_gdn_state(cache, idx, new_conv, state.to(rec_state.dtype))
