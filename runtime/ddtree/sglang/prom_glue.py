"""The `ddtree_*` Prometheus series inside SGLang (ddtree.prom): the process's sink, and the decode-round hook.

SGLang runs prometheus_client in multiprocess mode when `--enable-metrics` is on: the launcher sets
PROMETHEUS_MULTIPROC_DIR before it starts the scheduler processes, every process writes its values to files
there, and the HTTP server's `/metrics` collects them. `sglang_sink` follows that: a sink only when the
directory is set, on a private registry (the files are what counts; a second registration in the default one
would clash), and only on tensor-parallel rank 0, the rank that writes the DDTREE lines, so no count is
multiplied by the TP size. `register()` (ddtree.sglang.plugin) installs it as the process's default: every
`MetricsLog`, `note_round` and `note_shadow_round` call in the process uses the same sink.

sglang is imported inside functions only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ddtree.prom import DDTreeProm, default_sink

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
logger = logging.getLogger("ddtree")


def _served_model_name() -> str:
    try:
        from sglang.srt.runtime_context import get_serving

        return str(get_serving().served_model_name or "")
    except Exception:  # not published in this process (a test's stand-in): the series stay unlabelled
        return ""


def _tp_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:  # no rank published: a single process
        return 0


def sglang_sink(environ: Mapping[str, str] | None = None) -> DDTreeProm | None:
    """The sink of this SGLang process: None without `--enable-metrics` (no multiprocess directory) or on a
    tensor-parallel rank other than 0."""
    env = os.environ if environ is None else environ
    if not env.get(MULTIPROC_ENV) or _tp_rank() != 0:
        return None
    from prometheus_client import CollectorRegistry

    sink = DDTreeProm(CollectorRegistry(auto_describe=False), _served_model_name())
    logger.info("DDTREE: ddtree_* Prometheus series on /metrics (model_name=%s)", sink.model_name)
    return sink


def note_round(dflash_round: bool, why: str, fallback: str, policy: bool) -> None:
    """The tree worker's decode-round hook, called once per `forward_batch_generation` with what it decided:
    `dflash_round` (prefill or idle: not a decode round, not counted), `why` (the batch needs DFLASH's chain
    verify: `request_kinds.dflash_round_reason`), `fallback` (a failed self-check's text: DFLASH's rounds
    from then on) and whether the shape policy runs (then `PolicyGlue.next_shape` counts tree and chain)."""
    sink = default_sink()
    if sink is None or dflash_round:
        return
    if fallback:
        sink.self_check_failed()
        sink.decode_round("dflash", "self-check")
    elif why:
        sink.decode_round("dflash", why)
    elif not policy:
        sink.decode_round("tree")


def note_shadow_round(dflash_round: bool) -> None:
    """The shadow worker's decode-round hook, once per `forward_batch_generation`: `dflash_round` (prefill or
    idle) is not a decode round. Every decode round of a shadow service is DFLASH's chain verify (the mode
    verifies the spine): kind `dflash`, reason `shadow`. The trees it builds to compare are the request-rounds of
    `ddtree_rounds_total` and the tree histograms, never a `tree` decode round."""
    sink = default_sink()
    if sink is not None and not dflash_round:
        sink.decode_round("dflash", "shadow")
