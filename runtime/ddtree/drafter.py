"""DFlash block-diffusion drafter: config, model, context cache and loader.

The architecture is the one z-lab published (arXiv 2602.06036, github.com/z-lab/dflash) and SGLang 0.5.23
serves as `--speculative-algorithm DFLASH` (`sglang/srt/models/dflash.py`):

- A few Qwen3-style decoder layers (pre-norm attention with q/k RMSNorm and RoPE, SwiGLU MLP). The attention is
  NOT causal: the block's tokens attend to each other in both directions.
- Input: the TARGET's token embeddings of the block `[bonus, mask, ..., mask]` (`block_size` tokens, the mask
  is `mask_token_id`). The drafter has no embedding table of its own.
- Context: the target's hidden states after the layers `target_layer_ids` for every committed token,
  concatenated on the feature axis (`[T, L*H]`), projected by `fc` (`L*H -> H`) and `hidden_norm`. Every
  drafter layer turns the projected context into extra keys/values (its own k_proj/v_proj, k_norm, RoPE at the
  tokens' absolute positions) placed before the block's keys/values. The context is NOT passed through the
  layer's input norm or MLP: it is K/V only.
- Output: the final `norm`, then the TARGET's lm_head (shared, not stored here) at block positions
  1..block_size-1, giving the drafter's guesses for depths 1..block_size-1 after the bonus token.

Positions: the committed context covers absolute positions 0..T-1 and the bonus token sits at position T (it is
committed but the target has not run it yet, so it has no hidden state), the masks at T+1..T+block_size-1.

Checkpoint layout (`config.json`) matches the published drafters: `model_type: "qwen3"`,
`architectures: ["DFlashDraftModel"]`, top-level `block_size` and `num_target_layers`, and
`dflash_config: {"mask_token_id": int, "target_layer_ids": [int, ...]}`; weights `layers.*`, `fc.weight`,
`hidden_norm.weight`, `norm.weight`, no embeddings and no lm_head. `load_drafter(path)` loads it with no hub
access and no trust_remote_code (the class is registered here in `DRAFTER_ARCHITECTURES`).

Engine API (batch-shaped; every row of a batch shares the context length T):

    drafter = load_drafter(path)                                   # eval mode, fp32 on cpu by default
    out = target(ids, output_hidden_states=True)
    feats = extract_context_feature(out.hidden_states, drafter.target_layer_ids)   # [B, T, L*H]
    logprobs = drafter.draft_logprobs(feats, bonus, target.get_input_embeddings(), target.lm_head)
    # logprobs: [B, block_size-1, V] float32, row d-1 = log-probs for depth d

`draft_logprobs` recomputes the context K/V from all T committed tokens every call: at tiny sizes that is cheap
and obviously right. To keep a round O(new tokens), keep a `DraftContext` (the drafter's KV cache of the
context; context K/V of a token depend only on that token's features and position, so caching is exact):

    ctx = drafter.new_context()
    drafter.extend_context(ctx, feats_of_newly_committed_tokens)  # [B, t, L*H], positions ctx.length...
    logprobs = drafter.draft_logprobs_cached(ctx, bonus, embed_fn, lm_head)
    ctx.truncate(n)                                                # only if the engine rewinds commits

`extract_context_feature` follows transformers' `output_hidden_states` tuple (index 0 = embeddings, index i+1 =
output of layer i). Keep `target_layer_ids` below the last target layer: transformers replaces the last entry
with the final-normed state, which SGLang's capture does not do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import PreTrainedModel, Qwen3Config

DEFAULT_MASK_TOKEN = "<|MASK|>"  # the token name SGLang and z-lab use
EmbedFn = Callable[[Tensor], Tensor]  # token ids [B, S] -> embeddings [B, S, H]
HeadFn = Callable[[Tensor], Tensor]  # hidden [B, S, H] -> logits [B, S, V]


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The published default: spread the captured layers over [1, num_target_layers - 3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(f"DFlash default layer choice needs >= 4 target layers, got {num_target_layers}")
    span = end - start
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def extract_context_feature(hidden_states: Sequence[Tensor], layer_ids: Sequence[int]) -> Tensor:
    """Concatenate the outputs of `layer_ids` from an `output_hidden_states` tuple: [B, T, L*H]."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@strict
class DFlashDraftConfig(Qwen3Config):
    """Qwen3 config plus the DFlash fields, saved in the published layout (model_type stays "qwen3")."""

    block_size: int = 16
    num_target_layers: int = 32
    dflash_config: dict[str, Any] | None = None

    # Some published drafters put mask_token_id / target_layer_ids at the top level instead of in
    # dflash_config; those land as plain attributes, so these readers try both (dflash_config first).
    def draft_mask_token_id(self) -> int:
        value = (self.dflash_config or {}).get("mask_token_id", getattr(self, "mask_token_id", None))
        if value is None:
            raise ValueError("DFlash config has no dflash_config.mask_token_id")
        return int(value)

    def draft_target_layer_ids(self) -> list[int]:
        ids = (self.dflash_config or {}).get("target_layer_ids", getattr(self, "target_layer_ids", None))
        if ids is None:
            return build_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        return [int(i) for i in ids]


class DFlashRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # fp32 statistics, as Qwen3RMSNorm
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, heads, S, D]; cos/sin: [B, S, D]
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


class DFlashRotary(nn.Module):
    """Neox-style RoPE; cos/sin computed per call (no buffers, so meta-device loading cannot miss them)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def forward(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        # position_ids: [B, S] -> cos, sin: [B, S, D]
        idx = torch.arange(0, self.head_dim, 2, device=position_ids.device, dtype=torch.float32)
        inv_freq = 1.0 / (self.theta ** (idx / self.head_dim))
        freqs = position_ids.float().unsqueeze(-1) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashDraftConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or config.num_attention_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = DFlashRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(self.head_dim, config.rms_norm_eps)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        # x: [B, S, H] -> k, v: [B, kv_heads, S, D] (k normed and rotated)
        b, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _rope(k, cos, sin), v

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        ctx_k: Tensor,
        ctx_v: Tensor,
        attention_mask: Tensor | None,
    ) -> Tensor:
        # x: [B, S, H]; ctx_k/ctx_v: [B, kv_heads, T, D]; attention_mask: [B|1, S, T+S] bool (True = attend)
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.num_heads, self.head_dim)).transpose(1, 2)
        q = _rope(q, cos, sin)
        k_blk, v_blk = self.kv(x, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=2)  # [B, kv_heads, T+S, D]
        v = torch.cat([ctx_v, v_blk], dim=2)
        mask = None if attention_mask is None else attention_mask.unsqueeze(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads)
        projected: Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, -1))  # [B, S, H]
        return projected


class DFlashMLP(nn.Module):
    def __init__(self, config: DFlashDraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DFlashDraftConfig) -> None:
        super().__init__()
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        ctx_k: Tensor,
        ctx_v: Tensor,
        attention_mask: Tensor | None,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, attention_mask)
        out: Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class DraftContext:
    """The drafter's KV cache: per-layer context keys/values of the committed tokens, in position order."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers  # each [B, kv_heads, T, D]
        self.values: list[Tensor | None] = [None] * num_layers
        self.length = 0

    def append(self, kv: Sequence[tuple[Tensor, Tensor]]) -> None:
        for i, (k, v) in enumerate(kv):
            old_k, old_v = self.keys[i], self.values[i]
            self.keys[i] = k if old_k is None else torch.cat([old_k, k], dim=2)
            self.values[i] = v if old_v is None else torch.cat([old_v, v], dim=2)
        self.length += kv[0][0].shape[2]

    def truncate(self, length: int) -> None:
        """Drop context positions >= length (only needed if the engine rewinds committed tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a context of {self.length} tokens to {length}")
        self.keys = [None if k is None else k[:, :, :length] for k in self.keys]
        self.values = [None if v is None else v[:, :, :length] for v in self.values]
        self.length = length

    def layer_kv(self, i: int) -> tuple[Tensor, Tensor]:
        k, v = self.keys[i], self.values[i]
        if k is None or v is None:
            raise ValueError("DraftContext is empty: extend it with the prompt's features first")
        return k, v


class DFlashDraftModel(PreTrainedModel):
    """The DFlash drafter (weights only for its layers, `fc`, `hidden_norm` and `norm`)."""

    config_class = DFlashDraftConfig
    config: DFlashDraftConfig
    base_model_prefix = "dflash"

    def __init__(self, config: DFlashDraftConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList([DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        n_feats = len(config.draft_target_layer_ids())
        self.fc = nn.Linear(n_feats * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        rope = dict(config.rope_parameters or {})
        theta = float(rope.get("rope_theta") or 10000.0)
        self.rotary = DFlashRotary(config.head_dim, theta)
        self.post_init()

    @property
    def block_size(self) -> int:
        return int(self.config.block_size)

    @property
    def mask_token_id(self) -> int:
        return self.config.draft_mask_token_id()

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config.draft_target_layer_ids()

    # --- context ---------------------------------------------------------------------------------------------
    def project_context(self, target_hidden: Tensor) -> Tensor:
        # target_hidden: [B, T, L*H] -> [B, T, H]
        projected: Tensor = self.hidden_norm(self.fc(target_hidden))
        return projected

    def context_kv(self, target_hidden: Tensor, start: int = 0) -> list[tuple[Tensor, Tensor]]:
        """Per-layer context K/V for tokens at positions start..start+T-1: each [B, kv_heads, T, D]."""
        b, t, _ = target_hidden.shape
        ctx = self.project_context(target_hidden)
        pos = torch.arange(start, start + t, device=ctx.device).expand(b, t)
        cos, sin = self.rotary(pos, ctx.dtype)
        return [cast(DFlashDecoderLayer, layer).self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def new_context(self) -> DraftContext:
        return DraftContext(len(self.layers))

    def extend_context(self, context: DraftContext, target_hidden: Tensor) -> None:
        """Append newly committed tokens' features ([B, t, L*H], positions context.length...) to the cache."""
        if target_hidden.shape[1] == 0:
            return
        context.append(self.context_kv(target_hidden, start=context.length))

    # --- block forward ---------------------------------------------------------------------------------------
    def forward(
        self,
        noise_embedding: Tensor,
        position_ids: Tensor,
        context: Sequence[tuple[Tensor, Tensor]],
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Run the block: noise_embedding [B, S, H] at position_ids [B, S] over per-layer context K/V.

        attention_mask: [B|1, S, T+S] bool, True = may attend; None = every query sees all context and the
        whole block (the inference case). Returns the final-normed hidden states [B, S, H].
        """
        cos, sin = self.rotary(position_ids, noise_embedding.dtype)
        x = noise_embedding
        for layer, (ctx_k, ctx_v) in zip(self.layers, context, strict=True):
            x = layer(x, cos, sin, ctx_k, ctx_v, attention_mask)
        normed: Tensor = self.norm(x)
        return normed

    def block_input_ids(self, bonus_token: Tensor) -> Tensor:
        # bonus_token: [B] -> [B, block_size]: [bonus, mask, ..., mask]
        ids = torch.full(
            (bonus_token.shape[0], self.block_size), self.mask_token_id, dtype=torch.long, device=bonus_token.device
        )
        ids[:, 0] = bonus_token
        return ids

    def _block_logprobs(
        self,
        context: Sequence[tuple[Tensor, Tensor]],
        ctx_len: int,
        bonus_token: Tensor,
        target_embed_fn: EmbedFn,
        target_lm_head: HeadFn,
    ) -> Tensor:
        ids = self.block_input_ids(bonus_token)  # [B, S]
        b, s = ids.shape
        pos = torch.arange(ctx_len, ctx_len + s, device=ids.device).expand(b, s)
        hidden = self.forward(target_embed_fn(ids), pos, context)  # [B, S, H]
        logits = target_lm_head(hidden[:, 1:])  # [B, S-1, V]
        return torch.log_softmax(logits.float(), dim=-1)

    @torch.no_grad()
    def draft_logprobs(
        self,
        target_hidden_context: Tensor,
        bonus_token: Tensor,
        target_embed_fn: EmbedFn,
        target_lm_head: HeadFn,
    ) -> Tensor:
        """Log-probs [B, block_size-1, V] for depths 1..block_size-1, recomputing the context K/V.

        target_hidden_context: [B, T, L*H] for committed positions 0..T-1; bonus_token: [B] at position T.
        """
        ctx_len = target_hidden_context.shape[1]
        kv = self.context_kv(target_hidden_context, start=0)
        return self._block_logprobs(kv, ctx_len, bonus_token, target_embed_fn, target_lm_head)

    @torch.no_grad()
    def draft_logprobs_cached(
        self,
        context: DraftContext,
        bonus_token: Tensor,
        target_embed_fn: EmbedFn,
        target_lm_head: HeadFn,
    ) -> Tensor:
        """Same as draft_logprobs, with the context K/V taken from a DraftContext (bonus at context.length)."""
        kv = [context.layer_kv(i) for i in range(len(self.layers))]
        return self._block_logprobs(kv, context.length, bonus_token, target_embed_fn, target_lm_head)


DRAFTER_ARCHITECTURES: dict[str, type[DFlashDraftModel]] = {"DFlashDraftModel": DFlashDraftModel}


def load_drafter(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DFlashDraftModel:
    """Load a DFlash drafter directory (config.json + safetensors) in eval mode; local files only."""
    config_path = Path(path) / "config.json"
    with config_path.open() as f:
        raw = json.load(f)
    archs = raw.get("architectures") or []
    cls = next((DRAFTER_ARCHITECTURES[a] for a in archs if a in DRAFTER_ARCHITECTURES), None)
    if cls is None:
        raise ValueError(f"{config_path}: architectures {archs} names no known drafter {sorted(DRAFTER_ARCHITECTURES)}")
    model: DFlashDraftModel = cls.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    loaded: DFlashDraftModel = model.to(device).eval()
    return loaded


def block_attention_mask(ctx_len: int, anchors: Tensor, block_size: int) -> Tensor:
    """Training mask for many blocks in one forward: [B, m*S, T + m*S] bool.

    anchors: [B, m] positions of each block's bonus token. Block j's queries see context positions < anchors[j]
    (the tokens committed before its bonus) and every token of block j, nothing else.
    """
    b, m = anchors.shape
    s = block_size
    ctx_pos = torch.arange(ctx_len, device=anchors.device)
    see_ctx = ctx_pos.view(1, 1, ctx_len) < anchors.view(b, m, 1)  # [B, m, T]
    see_ctx = see_ctx.repeat_interleave(s, dim=1)  # [B, m*S, T]
    blk = torch.arange(m * s, device=anchors.device) // s
    see_blk = (blk.view(-1, 1) == blk.view(1, -1)).expand(b, m * s, m * s)  # [B, m*S, m*S]
    return torch.cat([see_ctx, see_blk], dim=-1)


def position_decay_weights(block_size: int, gamma: float) -> Tensor:
    """Loss weight per depth 1..block_size-1: exp(-(d-1)/gamma), as DFlash training favours early depths."""
    d = torch.arange(block_size - 1, dtype=torch.float32)
    return torch.exp(-d / gamma) if gamma > 0 else torch.ones_like(d)
