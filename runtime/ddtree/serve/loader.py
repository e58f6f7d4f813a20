"""Load the reference engine for the resolved mode and read what the server needs from the model folder."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree.modes import Mode

log = logging.getLogger("ddtree.serve")
DEFAULT_CONTEXT_LEN = 4096


@dataclass(frozen=True)
class ModelInfo:
    context_len: int
    eos_token_ids: tuple[int, ...]
    block_size: int | None  # drafted block of the DFlash drafter; None without a drafter


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(v: Any) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v]
    if isinstance(v, list):
        return [x for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def read_model_info(model_path: str, draft_path: str | None, context_override: int | None) -> ModelInfo:
    cfg = _read_json(Path(model_path) / "config.json")
    text_cfg: dict[str, Any] = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else {}
    ctx = cfg.get("max_position_embeddings") or text_cfg.get("max_position_embeddings") or DEFAULT_CONTEXT_LEN
    gen = _read_json(Path(model_path) / "generation_config.json")
    eos = _ids(cfg.get("eos_token_id")) + _ids(text_cfg.get("eos_token_id")) + _ids(gen.get("eos_token_id"))
    block = None
    if draft_path:
        dcfg = _read_json(Path(draft_path) / "config.json")
        dflash: dict[str, Any] = dcfg["dflash_config"] if isinstance(dcfg.get("dflash_config"), dict) else {}
        b = dcfg.get("block_size") or dflash.get("block_size")
        block = int(b) if isinstance(b, int) else None
    return ModelInfo(
        context_len=int(context_override or ctx),
        eos_token_ids=tuple(dict.fromkeys(eos)),
        block_size=block,
    )


def stop_ids(tokenizer: Any, info: ModelInfo) -> tuple[int, ...]:
    """EOS ids from config, generation config and tokenizer, plus ChatML's end-of-turn if the vocab has it."""
    ids = list(info.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    vocab: Mapping[str, int] = tokenizer.get_vocab()
    if "<|im_end|>" in vocab:
        ids.append(vocab["<|im_end|>"])
    return tuple(dict.fromkeys(ids))


def load_engine(
    model_path: str,
    draft_path: str | None,
    mode: Mode,
    ddtree: Any,
    device: str,
    dtype: str,
    tokenizer_path: str | None = None,
) -> Any:
    """``ReferenceEngine.load``; imported here so argument errors never pay for importing torch."""
    from ddtree.engine import ReferenceEngine

    return ReferenceEngine.load(
        model_path,
        draft_path if mode.spec.drafts else None,
        mode.value,
        ddtree=ddtree,
        device=device,
        dtype=dtype,
        tokenizer_path=tokenizer_path,
    )
