"""One rank of test_sglang_policy_glue.py's real 2-process run of the tree worker's policy loop (torch.distributed,
gloo, CPU). Not a test module.

Each rank drives the worker's per-round calls (`PolicyGlue.next_shape` on `RoundLedger.due()`, then the round,
then `RoundLedger.close`) with the same acceptances and its own round times (a per-rank random jitter on top of
the shape's cost, as two GPUs' timings differ), twice: the costs reduced by the worker's `cost_max` over the
gloo group ("max"), and not ("own", the control). It writes the shapes it chose to OUT/rank<r>.json.

argv: OUT RANK WORLD PORT
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from ddtree.config import DDTreeConfig
from ddtree.policy import PolicyConfig, PolicySetting, ShapePolicy
from ddtree.sglang.policy_glue import PolicyGlue, RoundLedger
from ddtree.sglang.tree_round import cost_max
from ddtree.sglang.vocab_parallel import HeadShard

ROUNDS, BS = 300, 8


def main() -> None:
    out, rank, world, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = SimpleNamespace(cpu_group=dist.group.WORLD, world_size=world, rank_in_group=rank)
    head = HeadShard(weight=torch.zeros(1, 1), start=0, vocab=1, tp_size=world, rank=rank, group=group)
    got = {"max": drive(rank, cost_max(head)), "own": drive(rank, None)}
    (out / f"rank{rank}.json").write_text(json.dumps(got))
    dist.destroy_process_group()


def drive(rank: int, reduce_max: Callable[[torch.Tensor], torch.Tensor] | None) -> list[str]:
    glue = PolicyGlue(DDTreeConfig(budget=16, topk=4, policy=PolicySetting.parse("auto")), seed=3)
    shapes = glue.policy.config.shapes  # a shorter dwell than production's, so 300 rounds decide often
    glue.policy = ShapePolicy(PolicyConfig(shapes=shapes, dwell=8, explore=0.1, seed=3), glue.policy.setting)
    jitter = random.Random(100 + rank)  # this rank's timing noise
    now = [0.0]

    def clock() -> float:
        return now[0]

    ledger = RoundLedger(torch.device("cpu"), lag=2, reduce_max=reduce_max, clock=clock)
    chosen = []
    for _ in range(ROUNDS):
        s = glue.next_shape(BS, ledger.due())
        chosen.append(s.shape.label)
        ledger.open()
        base = 10.0 if s.is_chain else 8.0 + s.budget / 4  # tree16 12 ms, tree8 10, tree4 9, chain 10
        took = base + jitter.uniform(-4.0, 4.0)
        now[0] += took / 1e3
        smaller = glue.smaller(s.shape)
        committed = 3 if s.is_chain else 3 + min(s.budget, 16) / 16  # the same on every rank
        row = [round(committed * 4), 12, *(round((3 + b / 16) * 4) for b in smaller)]
        ledger.close(s.round_id, BS, torch.tensor([row] + [[0] * len(row)] * (BS - 1)), smaller)
    return chosen


if __name__ == "__main__":
    main()
