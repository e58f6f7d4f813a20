"""One rank of test_vocab_parallel.py's real 2-process run (torch.distributed, gloo, CPU). Not a test module.

Every rank builds the same full LM head and hidden states (integer-valued, so logits are exact integers and tie
across shard boundaries by construction), keeps its own rows, and plans the trees through the plugin's TP path:
`head_topk` (the two gathers over a GroupCoordinator-shaped adapter) then `plan_batch_topk`. It writes what it
got, and the unsharded reference, to OUT/rank<r>.pt.

argv: OUT RANK WORLD PORT SPLIT (comma-separated shard sizes)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from ddtree.sglang.batch_round import plan_batch, plan_batch_topk
from ddtree.sglang.vocab_parallel import HeadShard, head_topk


class Group:
    """The two members of SGLang's GroupCoordinator the plugin uses, over a torch.distributed group."""

    def __init__(self) -> None:
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:
        dist.all_gather(list(output.chunk(self.world_size)), input)


def main() -> None:
    out, rank, world, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    split = [int(x) for x in sys.argv[5].split(",")]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(7)
    bs, rows, hidden, vocab, budget, topk = 3, 5, 6, sum(split), 9, 4
    weight = torch.randint(-2, 3, (vocab, hidden), generator=g).float()
    weight[split[0] : split[0] + 3] = weight[split[0] - 3 : split[0]]  # equal rows across the first boundary
    states = torch.randint(-1, 2, (bs, rows, hidden), generator=g).float()  # [bs, R, H]
    start = sum(split[:rank])
    head = HeadShard(weight[start : start + split[rank]], start, vocab, world, rank, Group())
    vals, ids = head_topk(states, head, topk)  # [bs, R, k]
    roots, prefix = torch.arange(bs), torch.full((bs,), 10)
    plan = plan_batch_topk(vals, ids, roots, prefix, 16, budget)
    full = torch.log_softmax(states @ weight.T, dim=-1)  # [bs, R, V], what TP 1 computes
    reference = plan_batch(full, roots, prefix, 16, budget, topk)
    keep = ("tokens", "parents", "depths", "positions", "tree_mask", "retrieve_next_token", "retrieve_next_sibling")
    torch.save(
        {
            "vals": vals,
            "ids": ids,
            "plan": {name: getattr(plan, name) for name in keep},
            "reference": {name: getattr(reference, name) for name in keep},
            "scores": (plan.trees.scores, reference.trees.scores),
            "full": full,
        },
        out / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
