"""Greedy requests batched with a sampling one, on a DDTREE tree server with CUDA graphs (docs/sglang.md,
"CUDA graphs"): such a batch takes DFLASH's own chain round, whose verify replays the same target-verify graphs
the trees use; since those graphs read the tree-mask buffer (ddtree.sglang.graph_masks), the chain verify must
get the causal mask, or it reads the previous tree's. The greedy requests of the mixed batch must equal SGLang's
baseline token for token.

    OUT=/tmp bash dev/sglang_gpu/run.sh mixed      # on the GPU host; logs and results under $OUT/mixed
    MIXED_MODEL=hybrid OUT=/tmp bash dev/sglang_gpu/run.sh mixed   # the hybrid pair (bf16): GDN tree links too

Batches (the dense tiny pair in fp32 or the hybrid one in bf16, triton, graphs on, 48 tokens): the 6 harness
prompts greedy (tree rounds), then the same 6 with request 0 sampled (temperature 0.8): every round of that
batch is DFLASH's, whose chain verify on a hybrid target replays graphs captured on the GDN tree path (it must
get chain links, not the previous tree's; ddtree.sglang.hybrid_graphs). `MIXED_GRAPHS=0` runs it eagerly.
Exit 1 on any greedy difference or failed run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h

SAMPLED = {"temperature": 0.8, "top_k": 20}


def run(name: str, engine: dict[str, Any], env: dict[str, str], batches: list[list[list[int]]], out: Path) -> Any:
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = {"1": [SAMPLED] + [{}] * (len(batches[1]) - 1)}
    job = {"engine": engine, "batches": batches, "max_new_tokens": 48, "overrides": overrides}
    (run_dir / "job.json").write_text(json.dumps(job))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(h.DRIVER), str(run_dir / "job.json"), str(run_dir / "result.json")],
        cwd=run_dir, env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    (run_dir / "engine.log").write_text(log)
    print(f"  {name}: exit {proc.returncode}, {time.monotonic() - started:.0f}s", flush=True)
    if proc.returncode != 0:
        print(log[-3000:])
        return None, log
    return json.loads((run_dir / "result.json").read_text()), log


def main() -> int:
    model = os.environ.get("MIXED_MODEL", "dense")
    extra = int(os.environ.get("MIXED_EXTRA_PROMPTS", "20"))  # the prepared reference set (only 6 are used)
    graphs = ["--cuda-graph"] if os.environ.get("MIXED_GRAPHS", "1") == "1" else []
    args = h.parse_args(["--models", model, *graphs, "--extra-prompts", str(extra)])
    out = Path(os.environ.get("OUT", "/tmp")) / os.environ.get("MIXED_NAME", "mixed")
    pair = h.ensure_pair(args.cache, model, 1)
    refs = h.cached_reference(args.cache, model, pair, h.prompt_texts(extra), 48)[: len(h.PROMPTS)]
    ids = [r.prompt_ids for r in refs]
    batches = [ids, ids]
    base = h.engine_kwargs(pair, h.MODELS[model][1], args, len(ids), int(os.environ.get("MIXED_PORT", "33000")))
    if model == "hybrid":
        base |= {**h.hybrid_override(pair / "target"), "max_mamba_cache_size": 256}
    tree_engine, tree_env = h.mode_spec("tree", pair, args)
    baseline, _ = run("baseline", base, {}, batches, out)
    port = base["port"] + 400
    tree, log = run("tree", {**base, **tree_engine, "port": port, "nccl_port": port + 1}, tree_env, batches, out)
    if baseline is None or tree is None:
        return 1
    bad = 0
    for b, label in ((0, "all greedy"), (1, "request 0 sampled")):
        for i in range(len(ids)):
            if b == 1 and i == 0:
                continue  # the sampled request
            a, t = baseline["batches"][b][i]["output_ids"], tree["batches"][b][i]["output_ids"]
            ok = a == t
            bad += not ok
            print(f"  batch {b} ({label}) request {i}: {'equal' if ok else 'DIFFERENT'}")
    for needle in ("graphs read the tree mask", "GDN tree kernels", "take DFLASH's chain verify", "cuda graph: True"):
        print(f"  tree log lines with {needle!r}: {log.count(needle)}")
    print(f"{bad} greedy difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
