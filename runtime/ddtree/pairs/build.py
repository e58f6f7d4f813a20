"""Build one small pair on real text: a target (dense Qwen3 or hybrid Qwen3.5) trained on the pinned wheels'
sources, and a DFlash drafter distilled from its greedy continuations, with the pieces of `ddtree.tiny` (the
byte tokenizer and chat template, the target classes and training loop, the distillation, the chain check).

What differs from `ddtree.tiny`: the corpus (`ddtree.pairs.corpus`, real files, a held-out split by file), the
sizes (minutes on a GPU, seconds on the CPU with `SCALES["ci"]`), bf16 weights on disk (what a GPU serves), and
the report: held-out perplexity per byte, greedy samples on held-out prompts and the drafter's linear tau.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ddtree.tiny import chat_prompt_ids
from ddtree.tiny.arch import Arch
from ddtree.tiny.chain import greedy_chain
from ddtree.tiny.distill import DrafterSettings, collect_greedy, make_drafter, train_drafter
from ddtree.tiny.target import TargetShape, TrainSettings, make_target, train_target
from ddtree.tiny.tokenizer import ENDOFTEXT, IM_END, MASK, TOKEN_IDS, build_tokenizer

from . import corpus

PAIRS_VERSION = 2  # bump when the build's output changes for the same settings and corpus
log = logging.getLogger("ddtree.pairs")


@dataclass(frozen=True)
class PairSettings:
    target_shape: TargetShape
    target_train: TrainSettings
    drafter: DrafterSettings
    target_layer_ids: tuple[int, ...]
    full_attention_interval: int  # hybrid: 3 Gated DeltaNet layers per attention layer, as Qwen3.5
    # a whole conversation (template + prompt + completion, bytes) fits the training window: positions past it
    # were never trained (the first H200 build held out 256 + 512 against 512: perplexity 1e8 per byte)
    prompt_chars: int = 192
    completion_chars: int = 256
    distill_prompts: int = 768
    distill_new_tokens: int = 128
    eval_passages: int = 256  # held-out perplexity
    eval_prompts: int = 8  # held-out tau and greedy samples
    eval_new_tokens: int = 128
    heldout_fraction: float = 0.1
    train_passages: int | None = None  # None: every passage of every training file


_GPU_SHAPE = TargetShape(hidden_size=256, intermediate_size=768, num_layers=6, num_heads=4, num_kv_heads=2, head_dim=64)
SCALES: dict[str, PairSettings] = {
    # H200, both pairs at once: 800 steps took 34 s (dense) and 83 s (hybrid) under bf16 autocast, which left
    # both at 2.9 / 2.3 nats per byte with degenerate greedy text; now fp32 and 1200 steps, so that the hybrid
    # (transformers' torch GDN, ~0.1 s a step) builds in ~3 min and the benchmark still fits one 10-minute call
    "gpu": PairSettings(
        target_shape=_GPU_SHAPE,
        target_train=TrainSettings(steps=1200, batch_size=32, seq_len=512, lr=2e-3, warmup=50),
        drafter=DrafterSettings(num_layers=2, block_size=16, steps=800, batch_size=32, anchors_per_seq=8, lr=1e-3),
        target_layer_ids=(1, 3, 4),
        full_attention_interval=3,
    ),
    # seconds on one CPU thread: exercises every step, learns nothing
    "ci": PairSettings(
        target_shape=TargetShape(
            hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=16
        ),
        # a whole conversation (template + prompt + completion) within seq_len, or nothing is measured
        target_train=TrainSettings(steps=3, batch_size=2, seq_len=128, warmup=1),
        drafter=DrafterSettings(num_layers=1, block_size=4, steps=3, batch_size=2, anchors_per_seq=2),
        target_layer_ids=(0, 1),
        full_attention_interval=3,
        prompt_chars=24,
        completion_chars=32,
        distill_prompts=4,
        distill_new_tokens=8,
        eval_passages=4,
        eval_prompts=2,
        eval_new_tokens=8,
        train_passages=64,
    ),
}  # fmt: skip


def cache_key(arch: Arch, seed: int, settings: PairSettings, corpus_id: str) -> str:
    """The build's name by content: what it was built from (version, arch, seed, every setting, the corpus)."""
    import hashlib

    spec = json.dumps([PAIRS_VERSION, str(arch), seed, asdict(settings), corpus_id], sort_keys=True, default=str)
    return f"{arch}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"


def _conversation(tok: PreTrainedTokenizerBase, s: corpus.Sample) -> list[int]:
    return chat_prompt_ids(tok, s.prompt, False) + list(tok.encode(s.completion + IM_END + "\n"))


@torch.no_grad()
def heldout_perplexity(
    target: PreTrainedModel, tok: PreTrainedTokenizerBase, passages: list[corpus.Sample], max_len: int
) -> float:
    """exp(mean negative log-likelihood per completion byte), the prompt given, within the trained window
    (`max_len` positions): bytes, so comparable across tokenizers of the same text."""
    nll, count = 0.0, 0
    for s in passages:
        prompt = chat_prompt_ids(tok, s.prompt, False)
        ids = (prompt + list(tok.encode(s.completion)))[:max_len]
        logits = target(input_ids=torch.tensor([ids], device=target.device)).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
        labels = torch.tensor(ids[len(prompt) :], device=logp.device)
        nll -= float(logp.gather(1, labels.unsqueeze(1)).sum())
        count += len(labels)
    if count == 0:  # every completion fell outside the window: exp(0) = 1 would read as a perfect model
        raise ValueError(f"held-out perplexity: no completion byte within the {max_len}-position window")
    return math.exp(nll / count)


@torch.no_grad()
def greedy_text(target: PreTrainedModel, tok: PreTrainedTokenizerBase, prompt: str, new_tokens: int) -> str:
    ids = torch.tensor([chat_prompt_ids(tok, prompt, False)], device=target.device)
    cfg = GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, eos_token_id=TOKEN_IDS[IM_END], pad_token_id=TOKEN_IDS[ENDOFTEXT]
    )
    out = target.generate(input_ids=ids, generation_config=cfg)[0, ids.shape[1] :]
    return str(tok.decode(out.tolist(), skip_special_tokens=True))


def _save_bf16(model: PreTrainedModel, path: Path) -> None:
    model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(str(path))


def build(
    arch: Arch,
    out: Path,
    wheels: Path,
    seed: int = 0,
    settings: PairSettings = SCALES["gpu"],
    device: str = "cpu",
    manifest: tuple[corpus.Pin, ...] = corpus.MANIFEST,
) -> dict[str, object]:
    """DIR/target (model + tokenizer), DIR/draft, DIR/heldout.json (held-out prompts), DIR/build.json (report)."""
    t_start = time.perf_counter()
    dev = torch.device(device)
    torch.manual_seed(seed)
    tok = build_tokenizer()
    train_docs, heldout_docs = corpus.split(corpus.load(wheels, manifest), seed, settings.heldout_fraction)
    pc, cc = settings.prompt_chars, settings.completion_chars
    train = corpus.samples(train_docs, seed, pc, cc, settings.train_passages)
    heldout = corpus.samples(heldout_docs, seed + 1, pc, cc)

    target = make_target(arch, settings.target_shape, settings.full_attention_interval).to(dev)
    t0 = time.perf_counter()
    target_losses = train_target(target, [_conversation(tok, s) for s in train], settings.target_train, seed)
    t_target = time.perf_counter() - t0
    log.info("%s target: loss %.3f -> %.3f, %.1fs", arch, target_losses[0], target_losses[-1], t_target)

    t0 = time.perf_counter()
    prompts = [chat_prompt_ids(tok, s.prompt, False) for s in train[: settings.distill_prompts]]
    stop = [TOKEN_IDS[IM_END]]
    data = collect_greedy(
        target,
        prompts,
        settings.distill_new_tokens,
        stop,
        TOKEN_IDS[ENDOFTEXT],
        settings.target_layer_ids,
        chunk=256 if dev.type == "cuda" else 64,
    )
    torch.manual_seed(seed + 1)
    drafter = make_drafter(target, settings.drafter, TOKEN_IDS[MASK], settings.target_layer_ids).to(dev)
    drafter_losses = train_drafter(drafter, target, data, settings.drafter, seed + 1)
    t_drafter = time.perf_counter() - t0
    log.info("%s drafter: loss %.3f -> %.3f, %.1fs", arch, drafter_losses[0], drafter_losses[-1], t_drafter)

    t0 = time.perf_counter()
    ppl = heldout_perplexity(target, tok, heldout[: settings.eval_passages], settings.target_train.seq_len)
    eval_prompts = heldout[: settings.eval_prompts]
    accepts: list[int] = []
    for s in eval_prompts:
        accepts += greedy_chain(
            target, drafter, chat_prompt_ids(tok, s.prompt, False), settings.eval_new_tokens, stop
        ).accept_lengths
    greedy = [
        {"prompt": s.prompt, "greedy": greedy_text(target, tok, s.prompt, settings.eval_new_tokens)}
        for s in eval_prompts[:3]
    ]
    t_eval = time.perf_counter() - t0
    tau = sum(accepts) / max(1, len(accepts))
    log.info("%s held-out: perplexity/byte %.3f, linear tau %.2f, %.1fs", arch, ppl, tau, t_eval)

    target.generation_config = GenerationConfig(
        eos_token_id=[TOKEN_IDS[IM_END], TOKEN_IDS[ENDOFTEXT]], pad_token_id=TOKEN_IDS[ENDOFTEXT]
    )
    _save_bf16(target, out / "target")
    tok.save_pretrained(str(out / "target"))
    if arch is Arch.QWEN3_5:  # SGLang derives the layer types from it (transformers keeps only layer_types)
        cfg_path = out / "target" / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["full_attention_interval"] = settings.full_attention_interval
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    _save_bf16(drafter, out / "draft")
    # the held-out prompts a benchmark sends (files training never saw)
    (out / "heldout.json").write_text(json.dumps([s.prompt for s in heldout], indent=0) + "\n")
    report: dict[str, object] = {
        "pairs_version": PAIRS_VERSION,
        "arch": str(arch),
        "seed": seed,
        "device": str(dev),
        "corpus": {
            "hash": corpus.corpus_hash(manifest),
            "wheels": [f"{p.name}=={p.version}" for p in manifest],
            "train_files": len(train_docs),
            "heldout_files": len(heldout_docs),
            "train_passages": len(train),
            "heldout_passages": len(heldout),
        },
        "settings": asdict(settings),
        "params": {"target": sum(p.numel() for p in target.parameters()), "draft": drafter.num_parameters()},
        "target_loss_first_last": [target_losses[0], target_losses[-1]],
        "drafter_loss_first_last": [drafter_losses[0], drafter_losses[-1]],
        "distill_generated_tokens": data.generated_tokens,
        "heldout_perplexity_per_byte": round(ppl, 4),
        "heldout_tau_linear": round(tau, 3),
        "heldout_rounds": len(accepts),
        "greedy_samples": greedy,
        "seconds": {
            "target_train": round(t_target, 1),
            "distill": round(t_drafter, 1),
            "eval": round(t_eval, 1),
            "total": round(time.perf_counter() - t_start, 1),
        },
    }
    (out / "build.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
