"""R1: DFLASH's accepted lengths, recorded on a real pair and replayed at a real shape (a benchmark hook of the GPU
harness, never in production: only with `DDTREE_DFLASH_RECORD=<file>` or `DDTREE_DFLASH_REPLAY=<file>`).

SGLang's DFLASH worker has no acceptance replay of its own (`SGLANG_SIMULATE_ACC_LEN` forces one length for the
whole batch), so a tree-vs-DFLASH replay at the 27B shape measured DFLASH at tau 1 while the tree committed its
recorded acceptance. This patch wraps `DFlashWorkerV2._accept_block` (`dflash_worker_v2.py:2187`, called once a
decode round after the verify with keyword arguments, returning accept_len, commit_lens, bonus, out_tokens,
new_seq_lens):

- recording (`DDTREE_DFLASH_RECORD`): each round's accepted lengths per request, as a `ddtree-accepts/1` file
  (`ddtree.sglang.replay.AcceptRecorder`; a sync per round: a recording run, not a timed one);
- replay (`DDTREE_DFLASH_REPLAY`): each request accepts what its recorded request accepted in the same round
  (`LengthReplay`; request ids `replay-<i>-...` name the recorded request, dev/sglang_gpu/cost_bench.py gives
  them), after the real verify and acceptance ran: `force_accept` rewrites the round's outputs in place the way
  `apply_dflash_simulated_acceptance` (`dflash_utils.py:851`, "real-draft-token") does for one length, per row,
  so the round commits, moves KV and recurrent state for that many tokens. Its host time goes to
  `replay.HOST_CLOCK` (the round timer reports it as its own column).

Only `DFlashWorkerV2` itself is affected: DDTREE's tree worker (a subclass) has its own replay. The request ids
come from the batch `forward_batch_generation` receives (wrapped to keep them on the worker).
"""

from __future__ import annotations

import os
import time
from typing import Any

RECORD = "DDTREE_DFLASH_RECORD"
REPLAY = "DDTREE_DFLASH_REPLAY"


def force_accept(
    candidates: Any, target_predict: Any, lengths: Any, accept_len: Any, commit_lens: Any, bonus: Any, out_tokens: Any
) -> None:
    """In place, per row b: accept the first lengths[b] drafted tokens (candidates[b, 1 .. lengths[b]]), commit
    the target's choice after them as the bonus (target_predict[b, lengths[b]]), as SGLang's `_commit_accept`
    lays out a block (drafts shifted left, the bonus at the accept boundary). lengths: [bs] ints <= block - 1."""
    import torch

    n = lengths.to(device=candidates.device, dtype=torch.int64)
    chosen = target_predict.gather(1, n[:, None])[:, 0]
    accept_len.copy_(n)
    commit_lens.copy_(n + 1)
    bonus.copy_(chosen)
    block = int(candidates.shape[1])
    out_tokens[:, : block - 1].copy_(candidates[:, 1:])
    out_tokens[:, block - 1 :].fill_(0)
    out_tokens.scatter_(1, n[:, None], chosen[:, None].to(out_tokens.dtype))


def patch_worker_class(module: Any) -> None:
    """`sglang.srt.speculative.dflash_worker_v2`: DFlashWorkerV2 records or replays its accepted lengths."""
    from ddtree.sglang.replay import HOST_CLOCK, AcceptRecorder, LengthReplay

    cls = module.DFlashWorkerV2
    recorder = (
        AcceptRecorder(os.environ[RECORD], "DFLASH (dev/sglang_gpu R1)", every=1) if os.environ.get(RECORD) else None
    )
    replay = LengthReplay.from_file(os.environ[REPLAY], REPLAY) if os.environ.get(REPLAY) else None
    round_fn = cls.forward_batch_generation
    accept_fn = cls._accept_block

    def forward_batch_generation(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        self._ddtree_dev_rids = [req.rid for req in getattr(batch, "reqs", None) or ()]
        return round_fn(self, batch, *args, **kwargs)

    def _accept_block(self: Any, **kwargs: Any) -> Any:
        out = accept_fn(self, **kwargs)
        if type(self) is not cls:  # DDTREE's tree worker: its own replay and recording
            return out
        import torch

        accept_len, commit_lens, bonus, out_tokens, _ = out
        rids = getattr(self, "_ddtree_dev_rids", [])
        if len(rids) != int(accept_len.shape[0]):  # not a batch this wrapper saw (should not happen): leave it
            return out
        if recorder is not None:
            recorder.add(rids, accept_len.tolist())
        if replay is None:
            return out
        candidates = kwargs["candidates"]
        block = int(candidates.shape[1])
        lengths = replay.next_round(rids, block - 1)
        start = time.perf_counter()
        predict = kwargs.get("target_predict")
        if predict is None:  # the sampling verify's branch: the target's argmax, as SGLang's simulation takes
            predict = torch.argmax(kwargs["next_token_logits"], dim=-1)
        predict = predict.view(len(rids), block)
        wanted = torch.tensor(lengths, dtype=torch.int64).to(candidates.device, non_blocking=True)
        force_accept(candidates, predict, wanted, accept_len, commit_lens, bonus, out_tokens)
        HOST_CLOCK.add(start)
        return accept_len, commit_lens, bonus, out_tokens, None  # None: new_seq_lens from the forced commit_lens

    cls.forward_batch_generation = forward_batch_generation
    cls._accept_block = _accept_block
