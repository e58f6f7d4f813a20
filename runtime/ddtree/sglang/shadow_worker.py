"""The DDTREE `shadow` worker for SGLang: DFlashWorkerV2 plus DDTree statistics (`ddtree.sglang.shadow` says
what it observes; the `tree` worker is in tree_worker.py).

This module imports sglang (SGLang loads it through the plugin, `ddtree.sglang.plugin.worker_factory`)."""

from __future__ import annotations

import logging
import time
from typing import Any

from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from torch import Tensor

from ddtree.config import process_config
from ddtree.metrics import MetricsLog
from ddtree.sglang.compat import attribute_refusal
from ddtree.sglang.gates import hybrid_mode
from ddtree.sglang.prom_glue import note_shadow_round
from ddtree.sglang.shadow import DraftObservation, observe_draft, observe_draft_sharded
from ddtree.sglang.vocab_parallel import HeadShard, head_shard
from ddtree.stats import round_stats

logger = logging.getLogger("ddtree")


class DDTreeShadowWorker(DFlashWorkerV2):  # type: ignore[misc]
    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        refusal = attribute_refusal(self)
        if refusal:
            raise ValueError(refusal)
        self._ddtree_config = process_config()
        is_hybrid = mambaish_config(target_worker.model_runner.model_config) is not None
        hybrid = hybrid_mode(self._ddtree_config, is_hybrid=is_hybrid, exact_tree_path=False)
        for name in ("selector", "lilicorr"):
            if getattr(self, name, None) is not None:
                raise ValueError(f"DDTREE: DFLASH drafts with a {name} head are not supported")
        if getattr(self, "_is_domino", False):
            raise ValueError("DDTREE: Domino DFLASH drafts are not supported")
        head = head_shard(getattr(target_worker.model_runner.model, "lm_head", None))
        self._ddtree_rank = head.rank if isinstance(head, HeadShard) else 0  # rank 0 writes the DDTREE lines
        self._ddtree_log = MetricsLog(self._ddtree_config, int(self.block_size), hybrid)
        if self._ddtree_rank == 0:
            self._ddtree_log.start()
        self._ddtree_obs: DraftObservation | None = None
        self._ddtree_enabled = True

    def _ddtree_disable(self, why: str) -> None:
        if self._ddtree_enabled:
            logger.warning("DDTREE shadow statistics disabled: %s (tokens are unaffected)", why)
        self._ddtree_enabled = False

    def _greedy_sample_from_vocab_parallel_head(
        self, *, hidden_states: Tensor, lm_head: Any, chunk_size: int = 256
    ) -> Tensor:
        tokens: Tensor = super()._greedy_sample_from_vocab_parallel_head(
            hidden_states=hidden_states, lm_head=lm_head, chunk_size=chunk_size
        )
        if self._ddtree_enabled:
            head = head_shard(lm_head)
            if isinstance(head, str):
                self._ddtree_disable(head)
            else:
                try:
                    block, config = int(self.block_size), self._ddtree_config
                    if head.tp_size == 1:
                        obs = observe_draft(hidden_states, head.weight, tokens, block, config)
                    else:  # every rank, in lockstep: DFLASH's own head above gathers the same way
                        obs = observe_draft_sharded(hidden_states, head, tokens, block, config)
                    self._ddtree_obs = obs
                    if not self._ddtree_obs.spine_matches:
                        logger.warning("DDTREE shadow: a tree spine differs from DFLASH's draft this round")
                except Exception as err:  # a statistics failure must never reach the round
                    self._ddtree_disable(f"{type(err).__name__}: {err}")
        return tokens

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        self._ddtree_obs = None
        # ddtree_decode_rounds_total: a decode round (not prefill, not idle), DFLASH's chain verify
        note_shadow_round(batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle())
        t0 = time.perf_counter()
        result = super().forward_batch_generation(batch, *args, **kwargs)
        obs, self._ddtree_obs = self._ddtree_obs, None
        accept_lens = getattr(result, "accept_lens", None)
        if obs is not None and self._ddtree_enabled and self._ddtree_rank == 0 and isinstance(accept_lens, Tensor):
            lens = accept_lens.tolist()
            if len(lens) == len(obs.nodes):
                times = obs.round_times((time.perf_counter() - t0) * 1000.0)
                for stats in round_stats(lens, obs.shapes, [False] * len(lens), times):  # shadow verifies the spine
                    self._ddtree_log.record(stats)
        return result
