"""Request checks SGLang 0.5.23 lacks, added by the plugin in every server that loads it (every mode).

SGLang's `SamplingParams.verify` accepts any `top_k` of at least 1, but its scheduler packs the batch's top-k
values into an int32 tensor (`SamplingBatchInfo.from_schedule_batch`: `torch.tensor(top_ks, dtype=torch.int32)`):
one request with `top_k` >= 2**31 overflows there, and the scheduler's exception ends the whole server. The
plugin hooks `SamplingParams.verify` (SGLang's `HookRegistry`, a BEFORE hook) so such a request gets the
ValueError that SGLang answers with a 400, like its other sampling checks, before it reaches the scheduler.

Pure: no sglang import; `ddtree.sglang.plugin.register` installs it.
"""

from __future__ import annotations

from typing import Any

# the largest top_k SGLang's int32 top-k tensor holds; SGLang's own "whole vocabulary" value (1 << 30) is below it
TOP_K_MAX = 2**31 - 1
VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"


def top_k_refusal(top_k: Any) -> str | None:
    """The 400's message for a top_k the scheduler cannot hold, else None (SGLang's verify judges the rest)."""
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > TOP_K_MAX:
        return f"top_k must be -1 (disable) or in [1, {TOP_K_MAX}], got {top_k}."
    return None


def refuse_wide_top_k(params: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on `SamplingParams.verify(self, vocab_size)`: raises SGLang's ValueError (a 400) for a top_k
    beyond int32; returns None so SGLang's own verify runs unchanged otherwise."""
    refusal = top_k_refusal(getattr(params, "top_k", None))
    if refusal is not None:
        raise ValueError(refusal)
