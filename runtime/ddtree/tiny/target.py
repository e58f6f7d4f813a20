"""Tiny targets (stock transformers classes) and their brief training on the synthetic corpus.

`qwen3`: Qwen3ForCausalLM (dense). `qwen3_5`: Qwen3_5ForCausalLM (text-only Qwen3.5 hybrid, three Gated DeltaNet
"linear_attention" layers then one "full_attention" layer, the published 3:1 pattern). Random init is seeded;
training is a fixed number of AdamW steps over packed windows that start at conversation boundaries, so the
same seed gives the same weights.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

from .arch import Arch
from .tokenizer import ENDOFTEXT, IM_END, TOKEN_IDS, VOCAB_SIZE

log = logging.getLogger("ddtree.tiny")
LOG_EVERY = 25  # steps between progress lines (a build runs for minutes on a loaded CPU)


@dataclass(frozen=True)
class TargetShape:
    hidden_size: int = 96
    intermediate_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 24
    vocab_size: int = (VOCAB_SIZE + 7) // 8 * 8  # 264


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 400
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 5e-3
    warmup: int = 20
    weight_decay: float = 0.01


def make_target(arch: Arch, shape: TargetShape, full_attention_interval: int | None = None) -> PreTrainedModel:
    """`full_attention_interval` (hybrid only): every Nth layer attention, the others Gated DeltaNet; default
    one attention layer last."""
    common: dict[str, Any] = dict(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=[TOKEN_IDS[IM_END], TOKEN_IDS[ENDOFTEXT]],
        pad_token_id=TOKEN_IDS[ENDOFTEXT],
        bos_token_id=None,
        dtype="float32",
    )
    if arch is Arch.QWEN3:
        return Qwen3ForCausalLM(Qwen3Config(**common))
    every = full_attention_interval or shape.num_layers
    layer_types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(shape.num_layers)]
    config = Qwen3_5TextConfig(
        **common,
        layer_types=layer_types,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=shape.head_dim,
        linear_value_head_dim=shape.head_dim,
        linear_num_key_heads=shape.num_kv_heads,
        linear_num_value_heads=shape.num_heads,
    )
    return Qwen3_5ForCausalLM(config)


def _windows(
    stream: torch.Tensor, starts: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator
) -> torch.Tensor:
    # stream: [N] all conversations concatenated; starts: [C] conversation offsets -> [batch, seq_len + 1]
    pick = starts[torch.randint(len(starts), (batch,), generator=gen)]
    idx = pick.unsqueeze(1) + torch.arange(seq_len + 1)
    return stream[idx.clamp_max(len(stream) - 1)]


def train_target(
    model: PreTrainedModel, conversations: Sequence[list[int]], settings: TrainSettings, seed: int
) -> list[float]:
    """Next-token training on packed windows; returns the loss curve (one value per step)."""
    stream = torch.tensor([t for conv in conversations for t in conv], dtype=torch.long)
    lengths = torch.tensor([len(c) for c in conversations])
    starts = torch.cumsum(lengths, 0) - lengths
    starts = starts[starts < len(stream) - settings.seq_len - 1]
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    device = next(model.parameters()).device  # windows are drawn on the CPU (same draws on every device)
    model.train()
    losses: list[float] = []
    for step in range(settings.steps):
        batch = _windows(stream, starts, settings.batch_size, settings.seq_len, gen).to(device)  # [B, L+1]
        logits = model(input_ids=batch[:, :-1]).logits  # [B, L, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % LOG_EVERY == 0:
            log.info("target step %d/%d, loss %.3f", step + 1, settings.steps, losses[-1])
    model.eval()
    return losses
