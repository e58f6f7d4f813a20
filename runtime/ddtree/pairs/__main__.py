"""`python -m ddtree.pairs fetch --wheels DIR` | `python -m ddtree.pairs build --arch A --wheels DIR --cache DIR`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import SCALES, ensure
from .corpus import CorpusError, fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree.pairs", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the pinned corpus wheels (needs PyPI)")
    f.add_argument("--wheels", required=True, type=Path)
    b = sub.add_parser("build", help="build or reuse a pair; prints its directory")
    b.add_argument("--arch", required=True, choices=["qwen3", "qwen3_5"])
    b.add_argument("--wheels", required=True, type=Path)
    b.add_argument("--cache", required=True, type=Path)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--scale", choices=sorted(SCALES), default="gpu")
    b.add_argument("--device", default="cpu")
    b.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        if args.cmd == "fetch":
            fetch(args.wheels)
            print(args.wheels)
            return 0
        import torch
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(args.threads)
        hf_logging.set_verbosity_error()  # the GDN "falling back to torch" notices are expected
        hf_logging.disable_progress_bar()
        out, built = ensure(args.arch, args.wheels, args.cache, args.seed, args.scale, args.device)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = json.loads((out / "build.json").read_text())
    keys = ("arch", "heldout_perplexity_per_byte", "heldout_tau_linear", "seconds")
    print(json.dumps({"dir": str(out), "built": built} | {k: report[k] for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
