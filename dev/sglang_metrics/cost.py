"""tok/s of SGLang's CPU engine serving DDTREE tree mode with and without --enable-metrics (docs/monitoring.md,
"The `ddtree_*` series": the table and its result file).

One engine host (tests/runtime/sglang_host.py: SGLang imported once, each Engine forked from it, with the
checkout's runtime/), then PAIRS pairs of Engine launches, the two settings alternating (off, on, off, on, ...)
so that load on the machine falls on both alike. Each launch: the tiny dense pair in tree mode
(test_sglang_engine.py's engine arguments and TREE_ENV, with the log interval 50 as deployed and the self-check
off), the two tree prompts batched, NEW_TOKENS tokens each, BATCHES generate calls; tok/s = output tokens /
seconds of the generate calls after the first (the first pays warm-up).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD/tests/runtime:$PWD/runtime python3 dev/sglang_metrics/cost.py [PAIRS] [OUT.json]

(DDTREE_TINY_CACHE as for the tests: the folder holding qwen3/target and qwen3/draft.)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from sglang_host import EngineHost
from test_sglang_engine import DENSE_TEXTS, TREE, TREE_ENV, engine_kwargs
from tiny_cache import ensure_tiny

NEW_TOKENS, BATCHES = 32, 2


def prompts(target: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    out = []
    for i in TREE:
        messages = [{"role": "user", "content": DENSE_TEXTS[i]}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        out.append(list(encoded["input_ids"]))
    return out


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    models = ensure_tiny("qwen3")
    batch = prompts(models / "target")
    draft = {"speculative_algorithm": "DDTREE", "speculative_draft_model_path": str(models / "draft")}
    env = {**TREE_ENV, "DDTREE_LOG_INTERVAL": "50", "DDTREE_SELFCHECK_EVERY": "0"}
    host = EngineHost()
    runs: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(pairs):
            for setting in ("off", "on"):
                engine = {**engine_kwargs(models / "target"), **draft, "enable_metrics": setting == "on"}
                # a distinct environment per launch: the host memoises identical runs
                result, _ = host.run(
                    f"{setting}{i}", engine, [batch] * BATCHES, NEW_TOKENS, {**env, "COST_RUN": str(i)}
                )
                tokens = sum(len(o["output_ids"]) for b in result["batches"][1:] for o in b)
                tok_s = tokens / sum(result["batch_s"][1:])
                runs[setting].append(tok_s)
                print(f"pair {i} metrics {setting}: {tok_s:.2f} tok/s", flush=True)
    finally:
        host.close()
    summary: dict[str, Any] = {s: {"runs": v, "median": statistics.median(v)} for s, v in runs.items()}
    summary["on_vs_off"] = summary["on"]["median"] / summary["off"]["median"]
    print(json.dumps(summary, indent=2))
    if out is not None:
        out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
