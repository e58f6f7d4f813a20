"""Server lifecycle: starting (loading + warmup) -> ready -> stopping; or failed (the process exits 1)."""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from ddtree.modes import Mode
from ddtree.prom import DDTreeProm, RoundLabels
from ddtree.serve import faults
from ddtree.serve.args import HOLD_LOADING_ENV, ServerArgs
from ddtree.serve.loader import ModelInfo, load_engine, stop_ids
from ddtree.serve.stats import ServerStats
from ddtree.serve.worker import EngineWorker
from ddtree.stats import RoundStats

log = logging.getLogger("ddtree.serve")


class Phase(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


@dataclass(frozen=True)
class Loaded:
    engine: Any
    tokenizer: Any
    worker: EngineWorker
    stop_token_ids: tuple[int, ...]
    hybrid: str  # "exact" | "unsafe" | "none"


class AppState:
    def __init__(
        self,
        args: ServerArgs,
        mode: Mode,
        ddtree: Any,
        info: ModelInfo,
        device: str,
        dtype: str,
        on_fatal: Callable[[], None] = lambda: None,
    ) -> None:
        self.args = args
        self.mode = mode
        self.ddtree = ddtree
        self.info = info
        self.device = device
        self.dtype = dtype
        self.phase = Phase.STARTING
        self.loaded: Loaded | None = None
        self.error: str | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.ready_after_s: float | None = None
        self.on_fatal = on_fatal
        self.stats = ServerStats(
            model_name=args.served_model_name,
            context_len=info.context_len,
            speculative=mode.spec.drafts,
            draft_tokens_per_round=_draft_tokens(mode, info),
            log_every=args.decode_log_interval,
            emit=log.info,
        )
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start_loading(self) -> None:
        self._thread = threading.Thread(target=self._load, name="engine-load", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            _hold_loading(self.args.hold_loading_while)
            log.info("Load weight begin. mode=%s device=%s dtype=%s", self.mode.value, self.device, self.dtype)
            t0 = time.monotonic()
            a = self.args
            with collector_paused():
                _quiet_transformers()
                engine = load_engine(
                    a.model_path, a.draft_model_path, self.mode, self.ddtree, self.device, self.dtype, a.tokenizer_path
                )
            tok = engine.tokenizer
            log.info("Load weight end. took %.2f s", time.monotonic() - t0)
            _export_ddtree(engine, self.stats, self.args.served_model_name)
            stops = stop_ids(tok, self.info)
            if not self.args.skip_server_warmup:
                t1 = time.monotonic()
                ids = list(tok.encode("The capital of France is", add_special_tokens=False)) or [0]
                engine.generate(ids, max_new_tokens=2, temperature=0.0)
                log.info("Warmup done. took %.2f s", time.monotonic() - t1)
            worker = EngineWorker(faults.for_worker(engine), self.stats)
            worker.start()
            self.loaded = Loaded(engine, tok, worker, stops, str(getattr(engine, "hybrid", "none")))
            if self.phase is Phase.STARTING:
                self.phase = Phase.READY
            self.ready_after_s = time.monotonic() - self.started
            log.info("The server is fired up and ready to roll! (%.2f s after start)", self.ready_after_s)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.phase = Phase.FAILED
            log.error("Failed to load the engine: %s", self.error)
            self.on_fatal()

    def begin_shutdown(self) -> None:
        if self.phase in (Phase.STARTING, Phase.READY):
            self.phase = Phase.STOPPING

    def close(self) -> None:
        if self.loaded is not None:
            self.loaded.worker.stop(timeout=60)

    # -- views -----------------------------------------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        ddtree = self.ddtree
        if is_dataclass(ddtree) and not isinstance(ddtree, type):
            ddtree = asdict(ddtree)
        return {
            "engine": "reference",
            "version": _version(),
            **self.args.public_dict(),
            "mode": self.mode.value,
            "ddtree": ddtree,
            "hybrid": self.loaded.hybrid if self.loaded else None,
            "effective_device": self.device,
            "effective_dtype": self.dtype,
            "context_len": self.info.context_len,
            "max_total_num_tokens": self.info.context_len,
            "block_size": self.info.block_size,
            "stop_token_ids": list(self.loaded.stop_token_ids) if self.loaded else None,
            "phase": self.phase.value,
            "error": self.error,
            "ready_after_s": self.ready_after_s,
        }


def _draft_tokens(mode: Mode, info: ModelInfo) -> int | None:
    """Drafted tokens per round, the denominator of SGLang's accept rate: the chain for linear/shadow (spine
    verify), the deepest possible path for tree (a tree's accepted path is at most block_size - 1 long)."""
    if not mode.spec.drafts or info.block_size is None:
        return None
    return max(info.block_size - 1, 1)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while torch, transformers and the model load, then what they made
    frozen out of later collections. Those imports build millions of objects and hardly any garbage: the collector
    ran hundreds of passes for nothing, about 1 CPU-second of a reference server's ~9 s start (docs/server.md); the
    loaded objects live as long as the server, so later passes need not walk them either. Re-enabled (and nothing
    frozen) if loading fails."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def _hold_loading(path: str, poll_s: float = 0.2) -> None:
    """Wait while `path` exists (the lab's `ServerArgs.hold_loading_while`; nothing when it is "")."""
    if path and os.path.exists(path):
        log.info("Loading held while %s exists (%s)", path, HOLD_LOADING_ENV)
        while os.path.exists(path):
            time.sleep(poll_s)
        log.info("Loading released")


def _quiet_transformers() -> None:
    """No tqdm bars in the journal (the server's own lines say when loading starts and ends)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _version() -> str:
    from ddtree import __version__

    return __version__


def _export_ddtree(engine: Any, stats: ServerStats, model_name: str) -> None:
    """The engine's DDTREE rounds as `ddtree_*` series on /metrics (ddtree.prom), beside the `sglang:*` ones,
    from before the warm-up: the series count every round the DDTREE lines do. One round of this engine is one
    decode round (batch 1), labelled by the verify that made its tokens: a shadow service's is DFLASH's chain
    (`dflash`, reason `shadow`: the tree is built only for the statistics); a tree service's `chain` when the
    shape policy ran its chain (one node per depth), else `tree`."""
    log_ = getattr(engine, "metrics", None)
    if log_ is None:  # baseline and linear: no DDTREE rounds, no lines, no series
        return
    with_policy = getattr(engine, "policy", None) is not None
    verifies_tree = engine.mode.spec.verifies_tree

    def kind(stats: RoundStats) -> RoundLabels:
        if not verifies_tree:
            return ("dflash", "shadow")
        return ("chain", "") if with_policy and stats.width == 1 else ("tree", "")

    log_.prom = DDTreeProm(stats.registry, model_name, kind_of_round=kind)
