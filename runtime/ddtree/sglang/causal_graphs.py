"""DFLASH's own (causal, mask-free) target-verify CUDA graphs beside the tree's, for the tree worker's chain rounds.

A tree server's verify graphs read the tree mask (`ddtree.sglang.graph_masks`), so a chain verify replayed from
them reads a causal mask written before every replay. On the H200 (random-weight Qwen3-8B shape, triton backend)
that made a chain round inside the tree worker 1-3 ms slower than the same round in a DFLASH server (verify
40.7 against 37.7 ms at batch 32, 23.5 against 22.4 at 16: docs/runtime-perf.md), which is the whole gap between
the shape policy choosing the chain and DFLASH itself.

So on a dense target with CUDA graphs the worker keeps a second attention backend and a second decode graph
runner, captured the way SGLang 0.5.23 captures DFLASH's (its "verify without a custom mask" policy for the
triton backend restored for that capture only), and binds both to the target's model runner for the rounds
that take DFLASH's code (`bound`): the policy's chain rounds and the decode batches a tree cannot take
(sampling, log-probs, grammar). SGLang's UNO worker binds a private backend and runner the same way. Tree
verifies, prefills and the self-check's chain re-verify keep the target's own backend and graphs.

Hybrid targets are left out: their verify graphs carry the GDN backend's tree links (`hybrid_graphs`), which a
second backend would not share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ddtree.sglang.graph_masks import SKIP_SET_NAME


@dataclass(frozen=True)
class CausalVerifyGraphs:
    """The second backend and the graph runner captured on it."""

    backend: Any
    runner: Any

    @contextlib.contextmanager
    def bound(self, model_runner: Any) -> Iterator[None]:
        """The target's model runner verifies through these graphs inside the block, its own ones after."""
        backend, runner = model_runner.attn_backend, model_runner.decode_cuda_graph_runner
        model_runner.attn_backend, model_runner.decode_cuda_graph_runner = self.backend, self.runner
        try:
            yield
        finally:
            model_runner.attn_backend, model_runner.decode_cuda_graph_runner = backend, runner


def build_backend(model_runner: Any) -> Any:
    """A new attention backend of the target's kind, with its own workspace (UNO's way), carrying the runner's
    KV index translator. Called after the target's pools exist and before its graphs are captured."""
    workspace_flag = getattr(model_runner, "init_new_workspace", None)
    try:
        backend = model_runner._get_attention_backend(init_new_workspace=True)
    finally:
        if workspace_flag is not None:
            model_runner.init_new_workspace = workspace_flag
    translator = getattr(model_runner, "kv_index_translator", None)
    if translator is not None:
        translator.bind_and_verify_backends([backend])
    return backend


def capture(model_runner: Any, backend: Any, dflash_utils: Any, causal_skip_set: frozenset[str]) -> CausalVerifyGraphs:
    """Capture a decode graph runner of the target runner's class on `backend`, with SGLang's skip set as it was
    before the tree worker changed it (`causal_skip_set`: the graphs run the verify causally, no mask). The
    tree's skip set and the runner's own backend are restored whatever happens."""
    runner_class = type(model_runner.decode_cuda_graph_runner)
    tree_skip_set = getattr(dflash_utils, SKIP_SET_NAME)
    own_backend = model_runner.attn_backend
    setattr(dflash_utils, SKIP_SET_NAME, causal_skip_set)
    model_runner.attn_backend = backend  # the capture's mask policy looks at the runner's backend
    try:
        runner = runner_class(model_runner, attn_backend=backend)
    finally:
        model_runner.attn_backend = own_backend
        setattr(dflash_utils, SKIP_SET_NAME, tree_skip_set)
    return CausalVerifyGraphs(backend=backend, runner=runner)
