"""Run SGLang's real Engine once and write its greedy outputs as JSON (docs/sglang.md, "SGLang's engine on CPU,
in CI").

    python driver.py JOB.json RESULT.json

JOB: {"engine": {ServerArgs keyword arguments}, "batches": [[input_ids, ...], ...], "max_new_tokens": N,
"overrides": {"<batch index>": [{sampling params of request i}, ...]}} ("overrides" optional).
Each batch is one `Engine.generate` call (several requests in one call run batched in the scheduler), greedy,
`ignore_eos`, unless overridden per request. RESULT: {"startup_s", "generate_s", "batches": [[{"prompt_ids",
"output_ids", "meta_info"}, ...], ...]}.

Started by tests/runtime/test_sglang_engine.py with this directory on PYTHONPATH, so sitecustomize.py has already
installed the torchvision stub and the SGLang patches here and in every process SGLang spawns.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang

    started = time.monotonic()
    engine = sglang.Engine(**job["engine"])
    startup_s = time.monotonic() - started
    params = {"temperature": 0.0, "max_new_tokens": job["max_new_tokens"], "ignore_eos": True}
    batches: list[list[dict[str, Any]]] = []
    try:
        started = time.monotonic()
        for index, batch in enumerate(job["batches"]):
            overrides = job.get("overrides", {}).get(str(index))
            sampling: Any = [{**params, **o} for o in overrides] if overrides else params
            outs = engine.generate(input_ids=batch, sampling_params=sampling)
            batches.append(
                [
                    {"prompt_ids": prompt, "output_ids": out["output_ids"], "meta_info": out["meta_info"]}
                    for prompt, out in zip(batch, outs, strict=True)
                ]
            )
        generate_s = time.monotonic() - started
    finally:
        engine.shutdown()
    return {"startup_s": startup_s, "generate_s": generate_s, "batches": batches}


def main() -> None:
    job_path, result_path = sys.argv[1:3]
    result = run(json.loads(Path(job_path).read_text()))
    Path(result_path).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
