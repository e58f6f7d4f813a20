"""ddtree.sglang.causal_graphs on stand-in objects (pure logic: which backend, runner and skip set each step
sees, and that everything is put back). The graphs themselves are captured and measured on the H200
(dev/sglang_gpu/h200_policy_cost.sh: the log line "causal verify CUDA graphs captured", tokens equal)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ddtree.sglang.causal_graphs import CausalVerifyGraphs, build_backend, capture
from ddtree.sglang.graph_masks import SKIP_SET_NAME

pytestmark = pytest.mark.runtime

TREE_SKIP: frozenset[str] = frozenset({"FlashAttentionBackend"})  # Triton taken out by graph_masks
CAUSAL_SKIP = TREE_SKIP | {"TritonAttnBackend"}  # SGLang's own set


class Translator:
    def __init__(self) -> None:
        self.bound: list[Any] = []

    def bind_and_verify_backends(self, backends: list[Any]) -> None:
        self.bound += backends


class ModelRunner:
    def __init__(self) -> None:
        self.attn_backend = "tree-backend"
        self.init_new_workspace = False
        self.kv_index_translator = Translator()
        self.decode_cuda_graph_runner: Any = None

    def _get_attention_backend(self, init_new_workspace: bool = False) -> Any:
        self.init_new_workspace = init_new_workspace  # SGLang's builder leaves the flag set
        return SimpleNamespace(workspace=init_new_workspace)


def test_build_backend_has_its_own_workspace_and_the_runner_s_translator() -> None:
    runner = ModelRunner()
    backend = build_backend(runner)
    assert backend.workspace is True
    assert runner.init_new_workspace is False  # put back
    assert runner.kv_index_translator.bound == [backend]


def _runner_class(seen: list[tuple[Any, Any, frozenset[str]]], utils: Any, fail: bool = False) -> type:
    class GraphRunner:
        def __init__(self, model_runner: Any, *, attn_backend: Any = None) -> None:
            seen.append((model_runner.attn_backend, attn_backend, getattr(utils, SKIP_SET_NAME)))
            if fail and attn_backend == "causal-backend":
                raise RuntimeError("Capture cuda graph failed")
            self.backend = attn_backend

    return GraphRunner


@pytest.mark.parametrize("fail", [False, True])
def test_capture_sees_sglang_s_skip_set_and_restores_the_tree_s(fail: bool) -> None:
    utils = SimpleNamespace(**{SKIP_SET_NAME: TREE_SKIP})
    seen: list[tuple[Any, Any, frozenset[str]]] = []
    model_runner = ModelRunner()
    model_runner.decode_cuda_graph_runner = _runner_class(seen, utils, fail)(model_runner, attn_backend="tree-backend")
    seen.clear()
    if fail:
        with pytest.raises(RuntimeError):
            capture(model_runner, "causal-backend", utils, CAUSAL_SKIP)
    else:
        graphs = capture(model_runner, "causal-backend", utils, CAUSAL_SKIP)
        assert graphs.runner.backend == "causal-backend" and graphs.backend == "causal-backend"
    # during the capture: the second backend on the model runner and SGLang's set (capture without the mask)
    assert seen == [("causal-backend", "causal-backend", CAUSAL_SKIP)]
    assert getattr(utils, SKIP_SET_NAME) == TREE_SKIP and model_runner.attn_backend == "tree-backend"


def test_bound_swaps_backend_and_runner_for_the_block_only() -> None:
    model_runner = ModelRunner()
    model_runner.decode_cuda_graph_runner = "tree-graphs"
    graphs = CausalVerifyGraphs(backend="causal-backend", runner="causal-graphs")
    with graphs.bound(model_runner):
        assert (model_runner.attn_backend, model_runner.decode_cuda_graph_runner) == ("causal-backend", "causal-graphs")
    assert (model_runner.attn_backend, model_runner.decode_cuda_graph_runner) == ("tree-backend", "tree-graphs")
    with pytest.raises(ValueError), graphs.bound(model_runner):
        raise ValueError("a round failed")
    assert (model_runner.attn_backend, model_runner.decode_cuda_graph_runner) == ("tree-backend", "tree-graphs")
