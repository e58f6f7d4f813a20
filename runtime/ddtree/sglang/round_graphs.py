"""The tree worker's plan and commit replayed from CUDA graphs, one pair per batch size.

`plan_batch` and `commit_batch` have static shapes for a given batch size, but eagerly they are ~100 small
kernels each: on the H200 at batch 1 the eager plan + commit cost 3.8 ms against 1.3 ms for the per-request host
path they replace, and 0.7 ms replayed (docs/runtime-perf.md). So the worker captures them once per
batch size (up to `max_batch`, where the win is; larger batches run eagerly, already several times faster
than the host path) and replays them. On CUDA the plan is now the fused Triton planner (`ddtree.fused_tree`, five
launches): 0.05 ms replayed at batch 1, 0.23-0.44 ms eager (docs/runtime-perf.md). Each capture copies its
inputs into static buffers first; its outputs are static buffers that the next replay overwrites, so
`clone_result` copies what outlives the round.
Graphs of all batch sizes share one memory pool (they never run at the same time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from torch import Tensor

from ddtree.config import FusedBuild
from ddtree.sglang.batch_round import BatchCommit, BatchPlan, commit_batch, plan_batch

T = TypeVar("T")
DEFAULT_MAX_BATCH = 8  # measured crossover: eager batched beats the host path from batch 8 up (H200)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]
    output: Any


class RoundGraphs:
    """plan_batch / commit_batch for one worker's (slots, budget, topk), replayed from CUDA graphs."""

    def __init__(
        self,
        num_slots: int,
        budget: int,
        topk: int,
        max_batch: int = DEFAULT_MAX_BATCH,
        fused: FusedBuild | None = None,  # the worker's DDTreeConfig.fused_build (None: the process's)
    ) -> None:
        self.num_slots, self.budget, self.topk, self.max_batch = num_slots, budget, topk, max_batch
        self.fused = fused
        self._plans: dict[tuple[int, ...], _Captured] = {}
        self._commits: dict[tuple[int, ...], _Captured] = {}
        self._pool: Any = None

    def applies(self, batch_size: int, device: torch.device) -> bool:
        return device.type == "cuda" and 1 <= batch_size <= self.max_batch

    def plan(self, logprobs: Tensor, roots: Tensor, prefix_lens: Tensor) -> BatchPlan:
        """plan_batch(logprobs [bs, R, V], roots [bs], prefix_lens [bs]) from its graph (captured on first use)."""
        inputs = (logprobs, roots.to(torch.int64), prefix_lens.to(torch.int64))

        def run(lp: Tensor, root: Tensor, prefix: Tensor) -> BatchPlan:
            return plan_batch(lp, root, prefix, self.num_slots, self.budget, self.topk, self.fused)

        return self._replay(self._plans, inputs, run)

    def commit(self, plan: BatchPlan, accept_index: Tensor, accept_num: Tensor, target_predict: Tensor) -> BatchCommit:
        """commit_batch from its graph. `plan` must be the one `plan` just returned (its static buffers)."""
        inputs = (accept_index, accept_num, target_predict)

        def run(index: Tensor, num: Tensor, predict: Tensor) -> BatchCommit:
            return commit_batch(plan, index, num, predict)

        return self._replay(self._commits, inputs, run)

    def warm(self, batch_sizes: Sequence[int], rows: int, vocab: int, device: torch.device) -> None:
        """Run plan and commit once per batch size on dummy inputs, before any request: compiles their Triton
        kernels and captures the graphs of the sizes that replay (a policy's smaller budget first used
        mid-request cost 1.4-1.6 s of compiles at bs 1 on the H200). rows: draft depths (B - 1)."""
        for bs in batch_sizes:
            logprobs = torch.log_softmax(torch.zeros((bs, rows, vocab), device=device), dim=-1)
            roots = torch.zeros(bs, dtype=torch.int64, device=device)
            prefix = torch.ones(bs, dtype=torch.int64, device=device)
            replay = self.applies(bs, device)
            if replay:
                plan = self.plan(logprobs, roots, prefix)
            else:
                plan = plan_batch(logprobs, roots, prefix, self.num_slots, self.budget, self.topk, self.fused)
            index = torch.full((bs, self.num_slots), -1, dtype=torch.int32, device=device)
            index[:, 0] = torch.arange(bs, dtype=torch.int32, device=device) * self.num_slots  # the roots
            num = torch.zeros(bs, dtype=torch.int32, device=device)
            predict = torch.zeros((bs, self.num_slots), dtype=torch.int64, device=device)
            if replay:
                self.commit(plan, index, num, predict)
            else:
                commit_batch(plan, index, num, predict)

    def _replay(self, cache: dict[tuple[int, ...], _Captured], inputs: tuple[Tensor, ...], run: Callable[..., T]) -> T:
        key = tuple(size for tensor in inputs for size in tensor.shape)
        captured = cache.get(key)
        if captured is None:
            captured = cache[key] = self._capture(inputs, run)
        for static, value in zip(captured.inputs, inputs, strict=True):
            static.copy_(value)
        captured.graph.replay()
        return captured.output  # type: ignore[no-any-return]

    def _capture(self, inputs: tuple[Tensor, ...], run: Callable[..., Any]) -> _Captured:
        static = tuple(tensor.clone() for tensor in inputs)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream.__new__ unannotated
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph (allocator, lazy kernel loads)
            run(*static)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = run(*static)
        return _Captured(graph=graph, inputs=static, output=output)


def clone_result(value: T) -> T:
    """A dataclass of tensors (BatchCommit) with every tensor copied out of a graph's static buffers."""
    copies = {f.name: getattr(value, f.name) for f in fields(value)}  # type: ignore[arg-type]
    for name, item in copies.items():
        if isinstance(item, Tensor):
            copies[name] = item.clone()
    return type(value)(**copies)
