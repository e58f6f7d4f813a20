"""`python -m ddtree.tiny --arch {qwen3,qwen3_5} --out DIR [--seed N] [--threads N] [--force]`.

Builds into a sibling temporary directory and renames it into place, so DIR is either absent or complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .arch import Arch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree.tiny", description=__doc__)
    parser.add_argument("--arch", required=True, choices=[a.value for a in Arch])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (fixed for reproducible weights)")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    args = parser.parse_args(argv)

    out: Path = args.out
    if out.exists() and not args.force:
        print(f"error: {out} exists (use --force to replace it)", file=sys.stderr)
        return 2
    import torch  # here, after the arguments: a bad one is refused in milliseconds, not after torch's import
    from transformers.utils import logging as hf_logging

    from .atomic_dir import build_into
    from .pipeline import build

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    # one thread: on a shared, loaded CPU extra threads spin on each other (measured 5-10x slower at 2)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()  # the GDN "falling back to torch" notices are expected on CPU
    hf_logging.disable_progress_bar()
    report = build_into(out, lambda partial: build(Arch(args.arch), partial, seed=args.seed))
    summary = {k: report[k] for k in ("arch", "seed", "heldout_tau_linear", "seconds")}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
