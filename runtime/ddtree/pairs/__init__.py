"""Small target/drafter pairs trained on real text, for measuring the modes' speed on a GPU.

`python -m ddtree.pairs fetch --wheels DIR` downloads the corpus (pinned PyPI wheels, `corpus.MANIFEST`);
`python -m ddtree.pairs build --arch {qwen3,qwen3_5} --wheels DIR --cache DIR [--device cuda]` builds a pair, or
reuses the one already cached under its content hash (`build.cache_key`), and prints its directory.
`ddtree.tiny` stays the lab's and CI's pair; this one is for `dev/sglang_gpu/pairs_bench.sh`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .build import PAIRS_VERSION, SCALES, PairSettings, build, cache_key
from .corpus import MANIFEST, Pin, corpus_hash

__all__ = ["PAIRS_VERSION", "SCALES", "PairSettings", "ensure"]


def ensure(
    arch: str,
    wheels: Path,
    cache: Path,
    seed: int = 0,
    scale: str = "gpu",
    device: str = "cpu",
    manifest: tuple[Pin, ...] = MANIFEST,
) -> tuple[Path, bool]:
    """(the pair's directory, whether it was built now): reused when cache/<key>/build.json exists, else built
    into a sibling temporary directory and renamed into place, so the directory is absent or complete."""
    from ddtree.tiny.arch import Arch
    from ddtree.tiny.atomic_dir import build_into

    settings = SCALES[scale]
    out = cache / cache_key(Arch(arch), seed, settings, corpus_hash(manifest))
    report = out / "build.json"
    if report.is_file() and json.loads(report.read_text()).get("pairs_version") == PAIRS_VERSION:
        return out, False
    build_into(out, lambda partial: build(Arch(arch), partial, wheels, seed, settings, device, manifest))
    return out, True
