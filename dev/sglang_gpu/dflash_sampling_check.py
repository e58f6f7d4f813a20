"""Does `linear` (SGLang's DFLASH) really sample on the GPU harness? One DFLASH Engine on a tiny pair (harness.py's,
built if missing), the same prompts twice at each temperature: greedy must repeat itself token for token, a sampled
run must not (DFLASH draws its coins from the global RNG, so the second draw differs), and the accepted length per
temperature is printed (it should move with the temperature). Exit 1 when greedy differs or a sampled run repeats
every prompt (what a greedy fallback does: the stand-in's G6 with DDTREE_DEV_GREEDY_DFLASH_VERIFY=1).

    bash dev/sglang_gpu/run.sh sampling --model hybrid --temperatures 0,0.7,1   # JSON under $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hybrid", choices=("dense", "hybrid"))
    p.add_argument("--temperatures", default="0,0.7,1")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--cache", type=Path, default=HERE.parents[1] / ".cache" / "sglang_gpu")
    p.add_argument("--json", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "dflash_sampling.json")
    args = p.parse_args(argv)
    import sglang
    from transformers import AutoTokenizer

    import harness

    pair = harness.ensure_pair(args.cache, args.model, threads=8)
    dtype = "float32" if args.model == "dense" else "bfloat16"
    opts = argparse.Namespace(cuda_graph=True, mem_fraction=0.3, tp=1)
    kwargs = {**harness.engine_kwargs(pair, dtype, opts, 8, 30100), "speculative_algorithm": "DFLASH",
              "speculative_draft_model_path": str(pair / "draft"), "skip_tokenizer_init": True}  # fmt: skip
    if args.model == "hybrid":
        kwargs.update(harness.hybrid_override(pair / "target"))
    tok = AutoTokenizer.from_pretrained(str(pair / "target"))
    prompts = [tok(text)["input_ids"] for text in harness.prompt_texts(0)]
    engine = sglang.Engine(**kwargs)
    out: dict[str, Any] = {"model": args.model, "temperatures": {}}
    try:
        for t in (float(x) for x in args.temperatures.split(",")):
            params = {"temperature": t, "max_new_tokens": args.new_tokens, "ignore_eos": True}
            runs = [engine.generate(input_ids=prompts, sampling_params=params) for _ in range(2)]
            tokens = [[o["output_ids"] for o in run] for run in runs]
            same = sum(a == b for a, b in zip(*tokens, strict=True))
            accept = [o["meta_info"].get("spec_accept_length") or 0.0 for run in runs for o in run]
            out["temperatures"][f"{t:g}"] = {"prompts": len(prompts), "same_tokens": same,
                                             "accept_length": statistics.fmean(accept)}  # fmt: skip
            print(f"T={t:g}: {same}/{len(prompts)} prompts gave the same tokens twice, "
                  f"accept length {statistics.fmean(accept):.2f}", flush=True)  # fmt: skip
    finally:
        engine.shutdown()
    checks = out["temperatures"]
    ok = all(v["same_tokens"] == v["prompts"] for k, v in checks.items() if float(k) == 0)
    ok = ok and all(v["same_tokens"] < v["prompts"] for k, v in checks.items() if float(k) > 0)
    out["ok"] = ok
    args.json.write_text(json.dumps(out, indent=1))
    print("sampling check:", "PASS" if ok else "FAIL (greedy not repeatable, or a sampled run repeated itself)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
