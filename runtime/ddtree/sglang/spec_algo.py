"""The DDTREE speculative algorithm's `CustomSpecAlgo` for SGLang's registry (`ddtree.sglang.plugin.register`
passes it as `spec_class`).

This module imports sglang; the plugin imports it only when it registers."""

from __future__ import annotations

from typing import Any

from sglang.srt.managers.overlap_utils import FutureMap
from sglang.srt.speculative.spec_registry import CustomSpecAlgo


class DDTreeSpecAlgo(CustomSpecAlgo):  # type: ignore[misc]
    """Answers SGLang's dispatch questions the way DFLASH does, so the scheduler and model runner set DDTREE up
    as DFLASH (aux hidden-state capture, draft KV pool, verify forward mode); only the worker differs."""

    def is_dflash(self) -> bool:
        return True

    def is_dflash_family(self) -> bool:
        return True

    def supports_target_verify_for_draft(self) -> bool:
        return True

    def supports_prefill_shared_read_done(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return True

    def need_topk(self) -> bool:
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def get_platform_worker_cls(self) -> type | None:
        return None

    def create_future_map(
        self,
        device: Any,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> Any:
        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)
