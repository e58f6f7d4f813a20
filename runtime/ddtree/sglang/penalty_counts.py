"""The output token counts a tree round's penalties read (`ddtree.acceptance.BatchRules.counts`, [bs, V] on the
device), kept across a worker's rounds instead of rebuilt from every request's whole `output_ids` on the host.

Each round `OutputCounts.sync` takes the decode batch's requests in their order and returns their counts: a row
follows its request through SGLang's `ScheduleBatch.filter_batch` (finished or retracted requests leave, the rest
keep their order) and `merge_batch` (a prefilled batch's requests join at the end) by the request's identity, so
rows are gathered, never recounted; a row adds only the output tokens its request committed since the last sync
(the tokens SGLang appended to `req.output_ids` after the previous round, whichever round committed them: a tree
round, DFLASH's, the prefill's), so a round costs O(new tokens) on the host and one small copy to the device. A
request seen for the first time (new, or back after a retraction) is counted once from its output; one whose
output got shorter than what was counted (a retraction that reset it) is counted afresh.

The counts are exactly what `batch_rules` counts from the outputs (sums of ones in float32, exact below 2**24, in
any order): only rows whose rules read the output (`RequestRules.reads_output`) count, the others stay zero.

Pure torch over duck-typed requests (`req.output_ids`); imports no sglang. Not safe under the overlap scheduler,
where `req.output_ids` lags a round: such batches take DFLASH's round (`request_kinds.dflash_round_reason`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


class OutputCounts:
    """One worker's running output counts. `vocab`: V, `device`: where the rows live."""

    def __init__(self, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.device = device
        self.counts = torch.zeros((0, vocab), dtype=torch.float32, device=device)  # [bs, V], the last sync's rows
        # the requests of the last sync, in row order: held so their ids stay theirs until the next sync
        self._reqs: list[Any] = []
        self._counted: list[int] = []  # per row: how many output tokens are in its counts

    def sync(self, reqs: Sequence[Any], reading: Sequence[bool]) -> Tensor:
        """[bs, V] float32 counts of each request's `output_ids`, rows in `reqs`' order; rows whose `reading` is
        False stay zero. The tensor is this object's and changes with the next sync: read it before then."""
        if len(reqs) != len(reading):
            raise ValueError(f"{len(reqs)} requests for {len(reading)} reading flags")
        self._follow(reqs)
        rows: list[int] = []
        tokens: list[int] = []
        fresh: list[int] = []  # rows counted from scratch
        for b, (req, reads) in enumerate(zip(reqs, reading, strict=True)):
            output = req.output_ids
            start = self._counted[b]
            if not reads:  # its rules read no output: a zero row, as batch_rules leaves it
                self._counted[b] = 0
                if start:
                    fresh.append(b)
                continue
            if len(output) < start:  # the output was cut back under us: count it all again
                fresh.append(b)
                start = 0
            new = [int(t) for t in output[start:] if 0 <= t < self.vocab]
            rows += [b] * len(new)
            tokens += new
            self._counted[b] = len(output)
        if fresh:
            self.counts[torch.tensor(fresh, dtype=torch.int64).to(self.device)] = 0.0
        if tokens:
            flat = torch.tensor([r * self.vocab + t for r, t in zip(rows, tokens, strict=True)], dtype=torch.int64)
            flat = flat.to(self.device)
            self.counts.view(-1).scatter_add_(0, flat, torch.ones(flat.shape, dtype=torch.float32, device=self.device))
        return self.counts

    def _follow(self, reqs: Sequence[Any]) -> None:
        """Reorder the rows to `reqs`: kept requests keep their rows (filter), new ones get zero rows (merge)."""
        if len(reqs) == len(self._reqs) and all(a is b for a, b in zip(reqs, self._reqs, strict=True)):
            return
        row_of = {id(req): i for i, req in enumerate(self._reqs)}
        old = [row_of.get(id(req), -1) for req in reqs]
        counted = [self._counted[i] if i >= 0 else 0 for i in old]
        index = torch.tensor([max(i, 0) for i in old], dtype=torch.int64).to(self.device)
        keep = torch.tensor([i >= 0 for i in old], dtype=torch.bool).to(self.device)
        if self.counts.shape[0] == 0:
            counts = torch.zeros((len(reqs), self.vocab), dtype=torch.float32, device=self.device)
        else:
            counts = torch.where(keep.unsqueeze(1), self.counts.index_select(0, index), 0.0)  # [bs, V]
        self.counts, self._reqs, self._counted = counts.contiguous(), list(reqs), counted
