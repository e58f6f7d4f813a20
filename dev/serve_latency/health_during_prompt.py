"""/health latency while the reference server handles a large prompt (docs/server.md, "Limits, disconnects").

Starts a baseline server on the tiny dense model (as the runtime tests do), sends a 96 kB and a 1 MB prompt to
/v1/completions (both over the 4096-token context: the server tokenizes, then refuses them with a 400) and polls
/health on one kept-alive connection meanwhile. Side by side with older code: run it once with each tree first
on PYTHONPATH, e.g.

    git archive main runtime | tar -x -C /tmp/old
    S=dev/serve_latency/health_during_prompt.py
    PYTHONPATH=$PWD:/tmp/old/runtime:$PWD/tests/runtime python3 $S old
    PYTHONPATH=$PWD:$PWD/runtime:$PWD/tests/runtime python3 $S new

(DDTREE_TINY_CACHE as for the tests: the folder holding qwen3/target.)
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serve_process import ServeProcess

PROMPTS = (("96 kB prompt", "hello world " * 8_000), ("1 MB prompt", "hello world " * 85_000))


def main(label: str) -> None:
    models = Path(os.environ.get("DDTREE_TINY_CACHE", ".cache/tiny")) / "qwen3"
    server = ServeProcess.start(models, "baseline", Path(tempfile.mkdtemp()))
    try:
        server.wait_ready(600)
        for name, prompt in PROMPTS:
            raw = json.dumps({"prompt": prompt}).encode()
            latencies: list[float] = []
            with cf.ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url, timeout=300) as health:
                t0 = time.perf_counter()
                reply = pool.submit(server.post, "/v1/completions", raw, 600)
                while not reply.done() or not latencies:
                    t = time.perf_counter()
                    health.get("/health")
                    latencies.append(time.perf_counter() - t)
                    time.sleep(0.005)
                took = time.perf_counter() - t0
            print(
                f"{label}: {name}: HTTP {reply.result().status_code} in {took:.2f} s; /health n={len(latencies)} "
                f"median {statistics.median(latencies) * 1000:.1f} ms max {max(latencies) * 1000:.1f} ms",
                flush=True,
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this tree")
