"""Start-up gates for DDTREE inside SGLang. Pure: the few resolved ServerArgs values they read come in as a
`ServerFacts` value, so the rules are tested without SGLang and the plugin only has to read the facts.

Each gate raises `GateError` (a ValueError, which SGLang's argument resolution reports as a start-up failure)
with one line that names the flag or variable to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddtree.config import DDTreeConfig, HybridMode

# Attention backends whose SGLang 0.5.23 target-verify path reads `spec_info.custom_mask` (the flattened
# FULL_MASK tree mask, mask_indptr = cumsum(N * (seq_len + N))): triton_backend.py, flashinfer_backend.py.
TREE_MASK_BACKENDS: tuple[str, ...] = ("triton", "flashinfer")

# DFLASH's draft head runs inside a CUDA graph unless this is set; shadow statistics read the eager head.
EAGER_DRAFT_SAMPLER_ENV = "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER"


class GateError(ValueError):
    """A start-up configuration DDTREE refuses; the message is one line, prefixed `DDTREE: `."""

    def __init__(self, message: str) -> None:
        super().__init__(f"DDTREE: {message}")


@dataclass(frozen=True)
class ServerFacts:
    """The resolved SGLang server arguments the gates read."""

    page_size: int | None
    disable_overlap_schedule: bool
    attention_backend: str | None
    prefill_attention_backend: str | None
    decode_attention_backend: str | None
    use_rejection_sampling: bool
    accept_threshold_single: float
    accept_threshold_acc: float
    draft_model_path: str | None


def check_server(facts: ServerFacts, config: DDTreeConfig, environ: Mapping[str, str]) -> None:
    """Every gate that needs only the server arguments and the DDTREE_* environment."""
    if facts.page_size != 1:
        raise GateError(
            f"--page-size must be 1 (got {facts.page_size}): accepted tree nodes are not contiguous slots, "
            "so the commit keeps them one KV slot each"
        )
    if not facts.disable_overlap_schedule:
        raise GateError("pass --disable-overlap-schedule: the DDTREE worker runs synchronously (no overlap)")
    backends = {
        "--attention-backend": facts.attention_backend,
        "--prefill-attention-backend": facts.prefill_attention_backend,
        "--decode-attention-backend": facts.decode_attention_backend,
    }
    if all(value is None for value in backends.values()):
        raise GateError(
            f"pass --attention-backend {TREE_MASK_BACKENDS[0]}: the automatic choice may be a backend that "
            f"ignores the tree mask (supported: {', '.join(TREE_MASK_BACKENDS)})"
        )
    for flag, value in backends.items():
        if value is not None and value not in TREE_MASK_BACKENDS:
            raise GateError(f"{flag} {value} cannot take the tree mask; use one of {', '.join(TREE_MASK_BACKENDS)}")
    if facts.use_rejection_sampling:
        raise GateError("--speculative-use-rejection-sampling is not supported: DDTREE verifies greedily")
    if facts.accept_threshold_single != 1.0 or facts.accept_threshold_acc != 1.0:
        raise GateError("--speculative-accept-threshold-single/-acc must stay 1.0: DDTREE acceptance is exact (greedy)")
    if facts.draft_model_path is None:
        raise GateError("pass --speculative-draft-model-path: DDTREE drafts with a DFlash drafter")
    # DDTREE_VERIFY=tree passes here: its worker (tree_worker.py) refuses budgets beyond the DFLASH block, the
    # draft heads it cannot read, and hybrid targets without the exact GDN tree path (docs/sglang.md).
    if config.verify.spec.eager_draft_head and environ.get(EAGER_DRAFT_SAMPLER_ENV, "").strip() != "1":
        raise GateError(
            f"set {EAGER_DRAFT_SAMPLER_ENV}=1: shadow mode builds its tree from DFLASH's eager draft head "
            "(the CUDA-graph sampler returns tokens only)"
        )


def hybrid_mode(config: DDTreeConfig, is_hybrid: bool, exact_tree_path: bool) -> HybridMode:
    """How verify treats recurrent layers, or GateError. `exact_tree_path`: the target's linear-attention
    backend runs SGLang's parent-indexed tree kernels (conv window from ancestors, recurrent state from the
    parent). Shadow verifies the spine, a chain, which SGLang's chain path handles exactly."""
    if not is_hybrid:
        return HybridMode.NONE
    if not config.verify.spec.verifies_tree or exact_tree_path:  # a chain verify is exact on SGLang's chain path
        return HybridMode.EXACT
    if config.allow_hybrid_unsafe:
        return HybridMode.UNSAFE
    raise GateError(
        "DDTREE_VERIFY=tree on a hybrid (recurrent-layer) target needs the exact tree path, which this server "
        "does not have; set DDTREE_ALLOW_HYBRID_UNSAFE=1 to run it anyway (outputs may differ from the target)"
    )
