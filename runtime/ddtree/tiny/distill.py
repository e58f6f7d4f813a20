"""Distil a DFlash drafter from a target, the way published DFlash drafters are trained.

1. The target greedily answers training prompts (batched `generate`, left padded). A right-padded full forward
   then re-checks every generated token against the target's argmax (truncating at the first disagreement, so
   padding noise never leaks in) and records the features at `target_layer_ids` for every position.
2. Training samples anchor positions a in the generated part. The block is [token a, mask x (S-1)] at positions
   a..a+S-1; it sees the context features of positions < a and its own block; the labels are the target's
   tokens a+1..a+S-1. Many blocks share one forward through `block_attention_mask`. The loss is cross-entropy
   per depth weighted by exp(-(d-1)/gamma), as DFlash does, through the target's frozen embeddings and lm_head.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel

from ddtree.drafter import (
    DFlashDraftConfig,
    DFlashDraftModel,
    block_attention_mask,
    extract_context_feature,
    position_decay_weights,
)

from .target import LOG_EVERY

log = logging.getLogger("ddtree.tiny")


@dataclass(frozen=True)
class DistillData:
    tokens: Tensor  # [N, L] int64, right padded
    lengths: Tensor  # [N] valid tokens per row (prompt + verified greedy continuation)
    prompt_lengths: Tensor  # [N]
    features: Tensor  # [N, L, F] target features at target_layer_ids

    @property
    def generated_tokens(self) -> int:
        return int((self.lengths - self.prompt_lengths).sum())


@dataclass(frozen=True)
class DrafterSettings:
    num_layers: int = 2
    block_size: int = 8
    steps: int = 400
    batch_size: int = 8
    anchors_per_seq: int = 8
    lr: float = 3e-3
    gamma: float = 4.0  # depth-decay of the loss weights


@torch.no_grad()
def collect_greedy(
    target: PreTrainedModel,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    stop_token_ids: Sequence[int],
    pad_token_id: int,
    layer_ids: Sequence[int],
    chunk: int = 64,
) -> DistillData:
    seqs: list[list[int]] = []
    for i in range(0, len(prompts), chunk):
        part = prompts[i : i + chunk]
        width = max(len(p) for p in part)
        ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in part])  # [b, width] left padded
        mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in part]).unsqueeze(1)).long()
        gen_cfg = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(stop_token_ids),
            pad_token_id=pad_token_id,
        )
        ids, mask = ids.to(target.device), mask.to(target.device)
        out = target.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)  # [b, width+n]
        for p, row in zip(part, out[:, width:].tolist(), strict=True):
            gen: list[int] = []
            for t in row:
                gen.append(t)
                if t in stop_token_ids:
                    break
            seqs.append(p + gen)
        log.info("greedy continuations: %d/%d prompts", len(seqs), len(prompts))

    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    prompt_lengths = torch.tensor([len(p) for p in prompts])
    feats: list[Tensor] = []
    for i in range(0, len(seqs), chunk):
        out = target(input_ids=tokens[i : i + chunk].to(target.device), output_hidden_states=True)  # right pad
        feats.append(extract_context_feature(out.hidden_states, layer_ids).cpu())  # the data stays on the CPU
        # keep only the prefix the full forward agrees with (left padding in generate may flip near-ties)
        pred = out.logits.argmax(-1).cpu()  # [b, width]
        for j in range(pred.shape[0]):
            r = i + j
            start, end = int(prompt_lengths[r]), int(lengths[r])
            ok = pred[j, start - 1 : end - 1] == tokens[r, start:end]
            bad = (~ok).nonzero()
            if len(bad):
                lengths[r] = start + int(bad[0])
    return DistillData(tokens, lengths, prompt_lengths, torch.cat(feats))


def make_drafter(
    target: PreTrainedModel, settings: DrafterSettings, mask_token_id: int, layer_ids: Sequence[int]
) -> DFlashDraftModel:
    tc = target.config
    config = DFlashDraftConfig(
        architectures=["DFlashDraftModel"],
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=tc.head_dim,
        rms_norm_eps=tc.rms_norm_eps,
        max_position_embeddings=tc.max_position_embeddings,
        block_size=settings.block_size,
        num_target_layers=tc.num_hidden_layers,
        dflash_config={"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
        eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id,
        dtype="float32",
    )
    return DFlashDraftModel(config)


def _sample_anchors(data: DistillData, rows: Tensor, m: int, gen: torch.Generator) -> Tensor:
    # anchors a in [prompt_len, len - 2]: the bonus token is generated, at least one label follows
    lo = data.prompt_lengths[rows]
    hi = data.lengths[rows] - 2
    u = torch.rand((len(rows), m), generator=gen)
    return lo.unsqueeze(1) + (u * (hi - lo + 1).unsqueeze(1)).long()  # [B, m]


def train_drafter(
    drafter: DFlashDraftModel,
    target: PreTrainedModel,
    data: DistillData,
    settings: DrafterSettings,
    seed: int,
) -> list[float]:
    s = settings.block_size
    usable = ((data.lengths - 2) >= data.prompt_lengths).nonzero().squeeze(1)
    if len(usable) == 0:
        raise ValueError("no greedy continuation long enough to train the drafter on")
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    for p in target.parameters():
        p.requires_grad_(False)
    device = next(drafter.parameters()).device  # batches are drawn on the CPU, then moved
    weights = position_decay_weights(s, settings.gamma).to(device)  # [S-1]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(drafter.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=settings.lr, total_steps=settings.steps, pct_start=0.05, anneal_strategy="cos"
    )
    drafter.train()
    losses: list[float] = []
    for step in range(settings.steps):
        rows = usable[torch.randint(len(usable), (settings.batch_size,), generator=gen)]  # [B]
        width = int(data.lengths[rows].max())
        toks = data.tokens[rows, :width].to(device)  # [B, T]
        anchors = _sample_anchors(data, rows, settings.anchors_per_seq, gen).to(device)  # [B, m]
        b, m = anchors.shape
        offs = torch.arange(s, device=device)
        pos = (anchors.unsqueeze(-1) + offs).reshape(b, m * s)  # [B, m*S]
        block_ids = torch.full((b, m, s), drafter.mask_token_id, dtype=torch.long, device=device)
        block_ids[:, :, 0] = toks.gather(1, anchors)
        label_pos = anchors.unsqueeze(-1) + offs[1:]  # [B, m, S-1]
        valid = label_pos < data.lengths[rows].to(device).view(b, 1, 1)
        labels = toks.gather(1, label_pos.clamp_max(width - 1).reshape(b, -1)).reshape(b, m, s - 1)
        labels = labels.masked_fill(~valid, -100)

        kv = drafter.context_kv(data.features[rows, :width].to(device))
        mask = block_attention_mask(width, anchors, s)  # [B, m*S, T+m*S]
        hidden = drafter(embed(block_ids.reshape(b, m * s)), pos, kv, mask)  # [B, m*S, H]
        logits = head(hidden.reshape(b, m, s, -1)[:, :, 1:])  # [B, m, S-1, V]
        ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(b, m, s - 1)
        w = weights * valid  # [B, m, S-1]
        loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % LOG_EVERY == 0:
            log.info("drafter step %d/%d, loss %.3f", step + 1, settings.steps, losses[-1])
    drafter.eval()
    return losses
