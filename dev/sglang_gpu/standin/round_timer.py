"""Per-round GPU timing of DFLASH's and DDTREE's decode rounds inside SGLang's scheduler (cost at real
shapes). Off unless `DDTREE_ROUND_TIMER=<file>` is set; then `gpu_patches` wraps `DFlashWorkerV2.__init__` so
that every DFLASH worker, and the DDTREE tree worker (a subclass), times its decode rounds.

CUDA events, no added synchronization inside a round: one event at the round's entry, one after the drafter's
forward (`draft_model_runner.forward`), one before and one after the target's verify forward
(`target_worker.forward_batch_generation(is_verify=True)`) and one at the round's exit, which is then waited for
(SGLang's non-overlap scheduler reads the round's tokens right after anyway). The same cut points for both modes:

- draft:  entry -> drafter forward done (block embedding, KV-location plan, the drafter's forward / graph replay);
- build:  drafter done -> verify forward starts (DFLASH: LM head + argmax, verify inputs; DDTREE: LM head +
  log_softmax, the trees, FULL_MASK, verify inputs);
- verify: the target's verify forward (graph replay where SGLang can);
- commit: verify done -> exit (acceptance: DFLASH's argmax compare, DDTREE's tree walk; KV / state commit; the
  target hidden states into the drafter's KV).

DDTREE's build is cut further (`patch_tree_worker`): head (drafter done -> the planner starts: LM head,
log_softmax), plan (`plan_batch` or its graph replay), mask (FULL_MASK, with the prefix-length sum) and prep
(verify inputs up to the forward).

Event-to-event times are on the GPU's timeline, so host launch gaps inside a segment count (what a round costs),
and the four add up to the round. Each round appends one JSON line: mode, bs, the four segments and the round in
ms, host timestamps at entry, at the end of the wait and at the timer's exit (the step interval between consecutive
rounds' entries = the round + this timer's own work after the wait + the scheduler's work between the timer's exit and
the next entry), the committed tokens (sum of accept lengths), whether the verify replayed a CUDA graph and the
acceptance replay's host time in the round (`replay_host_ms`, 0 without a replay).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

ENV = "DDTREE_ROUND_TIMER"


def _is_decode(batch: Any) -> bool:
    mode = batch.forward_mode
    return not (mode.is_extend() or batch.is_extend_in_batch or mode.is_idle())


ACTIVE: dict[str, Any] = {}  # the current round's events (one speculative worker per scheduler process)


def _replay_host_ms() -> float | None:
    """The acceptance replay's host time in this round (ddtree.sglang.replay.HOST_CLOCK: the tree's replay and
    DFLASH's, dflash_replay.py), None where the runtime has no clock."""
    try:
        from ddtree.sglang.replay import HOST_CLOCK
    except ImportError:
        return None
    return HOST_CLOCK.take()


def mark(name: str) -> None:
    """Record event `name` once per round (no-op outside a timed round)."""
    if ACTIVE and name not in ACTIVE:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        ACTIVE[name] = event


def instrument(worker: Any) -> None:
    """Wrap this worker's round, its drafter's forward and its target's verify forward (instance attributes)."""
    path = os.environ[ENV]
    mode = type(worker).__name__
    sink = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the scheduler process
    active = ACTIVE

    round_fn = worker.forward_batch_generation

    def timed_round(batch: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_decode(batch):
            return round_fn(batch, *args, **kwargs)
        host_start = time.perf_counter()
        active.clear()
        active["_"] = None
        mark("start")
        try:
            out = round_fn(batch, *args, **kwargs)
        except BaseException:
            active.clear()
            raise
        mark("end")
        events, _ = dict(active), active.clear()
        events["end"].synchronize()
        host_end = time.perf_counter()
        cuts = ["start", "draft_end", "verify_start", "verify_end", "end"]
        record: dict[str, Any] = {"mode": mode, "bs": len(batch.seq_lens), "host_start": host_start}
        if all(c in events for c in cuts):
            for name, a, b in zip(("draft", "build", "verify", "commit"), cuts, cuts[1:], strict=False):
                record[f"{name}_ms"] = events[a].elapsed_time(events[b])
        sub = ["draft_end", "plan_start", "plan_end", "mask_end", "verify_start"]
        if all(c in events for c in sub):
            for name, a, b in zip(("head", "plan", "mask", "prep"), sub, sub[1:], strict=False):
                record[f"{name}_ms"] = events[a].elapsed_time(events[b])
        if "draft_fwd_start" in events and "draft_end" in events:
            record["fwd_ms"] = events["draft_fwd_start"].elapsed_time(events["draft_end"])
        record["round_ms"] = events["start"].elapsed_time(events["end"])
        record["replay_host_ms"] = _replay_host_ms()
        record["host_ms"] = (host_end - host_start) * 1e3
        record["tokens"] = int(out.accept_lens.sum()) if getattr(out, "accept_lens", None) is not None else None
        record["cuda_graph"] = bool(getattr(out, "can_run_cuda_graph", False))
        record["host_exit"] = time.perf_counter()  # the timer's own work after the wait: host_exit - host_end
        record["host_end"] = host_end
        sink.write(json.dumps(record) + "\n")
        return out

    runner = worker.draft_model_runner
    draft_fn = runner.forward

    def timed_draft(*args: Any, **kwargs: Any) -> Any:
        mark("draft_fwd_start")  # fwd: the drafter's forward alone (its graph replay), without the input preparation
        out = draft_fn(*args, **kwargs)
        mark("draft_end")
        return out

    target = worker.target_worker
    verify_fn = target.forward_batch_generation

    def timed_verify(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("is_verify"):
            return verify_fn(*args, **kwargs)
        mark("verify_start")
        out = verify_fn(*args, **kwargs)
        mark("verify_end")
        return out

    worker.forward_batch_generation = timed_round
    runner.forward = timed_draft
    target.forward_batch_generation = timed_verify


def patch_worker_class(module: Any) -> None:
    """`sglang.srt.speculative.dflash_worker_v2`: DFlashWorkerV2.__init__ instruments the new worker."""
    cls = module.DFlashWorkerV2
    init = cls.__init__

    @functools.wraps(init)  # the plugin's start-up check reads __init__'s signature (ddtree.sglang.compat)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        instrument(self)

    cls.__init__ = __init__


def patch_tree_worker(module: Any) -> None:
    """`ddtree.sglang.round_runner`: marks around the planner (plan_batch / RoundGraphs.plan) and FULL_MASK."""

    def around(fn: Any, before: str, after: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            mark(before)
            out = fn(*args, **kwargs)
            mark(after)
            return out

        return wrapped

    module.plan_batch = around(module.plan_batch, "plan_start", "plan_end")
    module.RoundGraphs.plan = around(module.RoundGraphs.plan, "plan_start", "plan_end")
    module.full_mask_batched = around(module.full_mask_batched, "mask_start", "mask_end")
