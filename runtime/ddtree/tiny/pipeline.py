"""The tiny models' build: target, drafter, tokenizer and build.json (see the package docstring)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ddtree.tiny_version import BUILD_VERSION  # bump it there when the build changes its output

from . import corpus
from .arch import Arch
from .chain import greedy_chain
from .distill import DrafterSettings, collect_greedy, make_drafter, train_drafter
from .target import TargetShape, TrainSettings, make_target, train_target
from .tokenizer import IM_END, MASK, TOKEN_IDS, build_tokenizer

__all__ = ["BUILD_VERSION", "Arch", "BuildSettings", "build", "chat_prompt_ids"]

TARGET_LAYER_IDS = (1, 2)
log = logging.getLogger(
    "ddtree.tiny"
)  # outputs of target layers 1 and 2 (of 4); the last layer's entry is post-norm in HF


@dataclass(frozen=True)
class BuildSettings:
    target_shape: TargetShape = field(default_factory=TargetShape)
    target_train: TrainSettings = field(default_factory=TrainSettings)
    drafter: DrafterSettings = field(default_factory=DrafterSettings)
    corpus_size: int = 3000
    distill_prompts: int = 256
    distill_new_tokens: int = 80
    eval_prompts: int = 12
    eval_new_tokens: int = 64


def chat_prompt_ids(tok: PreTrainedTokenizerBase, user: str, thinking: bool) -> list[int]:
    """Token ids of a one-turn chat prompt ending with the assistant generation prompt."""
    text = tok.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    return list(tok.encode(text))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def build(arch: Arch, out: Path, seed: int = 0, settings: BuildSettings | None = None) -> dict[str, object]:
    """Build DIR/target and DIR/draft under `out`; returns the build report (also written to build.json)."""
    settings = settings or BuildSettings()
    t_start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    tok = build_tokenizer()
    stop = [TOKEN_IDS[IM_END]]

    samples = corpus.training_samples(settings.corpus_size, seed)
    conversations = [
        chat_prompt_ids(tok, s.prompt, thinking) + list(tok.encode(corpus.completion(s, thinking) + "\n"))
        for s, thinking in samples
    ]
    target = make_target(arch, settings.target_shape)
    t0 = time.perf_counter()
    target_losses = train_target(target, conversations, settings.target_train, seed)
    t_target = time.perf_counter() - t0
    log.info(
        "target trained: %d steps, loss %.3f -> %.3f, %.1fs",
        len(target_losses),
        target_losses[0],
        target_losses[-1],
        t_target,
    )

    t0 = time.perf_counter()
    distill_prompts = [chat_prompt_ids(tok, s.prompt, th) for s, th in samples[: settings.distill_prompts]]
    data = collect_greedy(
        target, distill_prompts, settings.distill_new_tokens, stop, TOKEN_IDS["<|endoftext|>"], TARGET_LAYER_IDS
    )
    t_collect = time.perf_counter() - t0
    log.info("collected %d greedy tokens, %.1fs", data.generated_tokens, t_collect)

    t0 = time.perf_counter()
    torch.manual_seed(seed + 1)
    drafter = make_drafter(target, settings.drafter, TOKEN_IDS[MASK], TARGET_LAYER_IDS)
    drafter_losses = train_drafter(drafter, target, data, settings.drafter, seed + 1)
    t_drafter = time.perf_counter() - t0
    log.info("drafter trained: loss %.3f -> %.3f, %.1fs", drafter_losses[0], drafter_losses[-1], t_drafter)

    t0 = time.perf_counter()
    heldout = corpus.heldout_prompts(settings.eval_prompts, seed + 1000, {s.prompt for s, _ in samples})
    accepts: list[int] = []
    for i, user in enumerate(heldout):
        res = greedy_chain(target, drafter, chat_prompt_ids(tok, user, i % 4 == 3), settings.eval_new_tokens, stop)
        accepts += res.accept_lengths
        log.info("held-out prompt %d/%d", i + 1, len(heldout))
    tau = sum(accepts) / max(1, len(accepts))
    t_eval = time.perf_counter() - t0
    log.info("held-out tau (linear) %.2f over %d rounds, %.1fs", tau, len(accepts), t_eval)

    target_dir, draft_dir = out / "target", out / "draft"
    target.generation_config = GenerationConfig(
        eos_token_id=[TOKEN_IDS[IM_END], TOKEN_IDS["<|endoftext|>"]], pad_token_id=TOKEN_IDS["<|endoftext|>"]
    )
    target.save_pretrained(str(target_dir))
    tok.save_pretrained(str(target_dir))
    drafter.save_pretrained(str(draft_dir))
    report: dict[str, object] = {
        "build_version": BUILD_VERSION,
        "arch": str(arch),
        "seed": seed,
        "threads": torch.get_num_threads(),
        # the weights depend on the kernels that trained them: another CPU family (or ISA level) builds other models
        "cpu": {"model": _cpu_model(), "torch_capability": torch.backends.cpu.get_cpu_capability()},
        "settings": asdict(settings),
        "target_loss_first_last": [target_losses[0], target_losses[-1]],
        "drafter_loss_first_last": [drafter_losses[0], drafter_losses[-1]],
        "distill_generated_tokens": data.generated_tokens,
        "heldout_prompts": heldout,
        "heldout_tau_linear": tau,
        "heldout_rounds": len(accepts),
        "seconds": {
            "target_train": round(t_target, 2),
            "collect": round(t_collect, 2),
            "drafter_train": round(t_drafter, 2),
            "eval": round(t_eval, 2),
            "total": round(time.perf_counter() - t_start, 2),
            "cpu_total": round(time.process_time() - cpu_start, 2),  # wall depends on how busy the box is
        },
    }
    (out / "build.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
