"""ddtree.sglang.hybrid_graphs: the chain links, the fill of a graph's static links, and (in a subprocess,
against SGLang 0.5.23's real GDN backend replay step, `MambaAttnBackendBase._replay_metadata`, on CPU) the
wrapper that captures the hybrid verify graphs on the tree path and never replays a previous round's links."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from ddtree.sglang.devcheck import random_tree
from ddtree.sglang.hybrid_graphs import chain_links, fill_verify_links
from ddtree.sglang.layout import stack_links, to_sglang_layout
from ddtree.tree import DraftTree
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sglang_cpu import Probe, ProbeResult  # noqa: E402

sys.path.remove(str(HERE))


def chain_tree(depth: int) -> DraftTree:
    nodes = depth + 1
    return DraftTree(
        tokens=torch.arange(nodes, dtype=torch.int64),
        parents=torch.arange(-1, depth, dtype=torch.int64),
        depths=torch.arange(nodes, dtype=torch.int64),
        scores=torch.zeros(nodes),
    )


@pytest.mark.parametrize("width", [1, 2, 8, 16])
def test_chain_links_are_the_layout_of_a_chain(width: int) -> None:
    _, next_token, next_sibling = stack_links([to_sglang_layout(chain_tree(width - 1), 5, width)] * 3)
    got_next, got_sibling = chain_links(3, width)
    assert got_next.dtype == got_sibling.dtype == torch.int32
    assert torch.equal(got_next.long(), next_token) and torch.equal(got_sibling.long(), next_sibling)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), graph_bs=st.integers(1, 6), width=st.integers(2, 16), data=st.data())
def test_fill_writes_the_trees_then_chains_over_whatever_was_there(
    seed: int, graph_bs: int, width: int, data: st.DataObject
) -> None:
    n = data.draw(st.integers(0, graph_bs))
    generator = torch.Generator().manual_seed(seed)
    layouts = [to_sglang_layout(random_tree(seed + b, width - 1, 3), 3, width) for b in range(n)]
    static_next = torch.randint(-1, width, (graph_bs, width), dtype=torch.int32, generator=generator)  # stale
    static_sibling = torch.randint(-1, width, (graph_bs, width), dtype=torch.int32, generator=generator)
    chain_next, chain_sibling = chain_links(graph_bs, width)
    if n:
        _, next_token, next_sibling = stack_links(layouts)
        fill_verify_links(static_next, static_sibling, next_token, next_sibling)
        assert torch.equal(static_next[:n].long(), next_token)
        assert torch.equal(static_sibling[:n].long(), next_sibling)
    else:  # a verify without links (DFLASH's own, a self-check's chain re-verify)
        fill_verify_links(static_next, static_sibling, None, None)
    assert torch.equal(static_next[n:], chain_next[n:]) and torch.equal(static_sibling[n:], chain_sibling[n:])


def test_fill_refuses_links_that_do_not_fit_the_graph() -> None:
    static = torch.zeros((2, 4), dtype=torch.int32), torch.zeros((2, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match="do not fit a graph of batch size 2"):
        fill_verify_links(*static, *chain_links(3, 4))
    with pytest.raises(ValueError, match="do not fit"):
        fill_verify_links(*static, *chain_links(2, 8))


# SGLang's real GDN backend (its replay step: the static buffers init_cuda_graph_state allocates, the copy
# _replay_metadata makes) behind SGLang's real HybridLinearAttnBackend; the pool is a two-method stand-in and the
# GDN layer's own qkv-routing step (it needs a real mamba cache) is left out.
_PROBE = """
import functools, json
from types import SimpleNamespace
import torch
from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend, MambaAttnBackendBase
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from ddtree.sglang.hybrid_graphs import replay_tree_links

MAX_BS, S = 4, 4
TREE = ([[1, 3, -1, -1]] * 3, [[-1, 2, -1, -1]] * 3)  # root -> {1, 2}, 1 -> 3; three requests


def backends(wrap):
    linear = object.__new__(GDNAttnBackend)
    pool = SimpleNamespace(
        get_mamba_indices=lambda idx: idx.to(torch.int32) + 1,
        translate_mamba_indices=lambda x: x,
        mamba_pool=SimpleNamespace(enable_linear_replayssm=False),
    )
    state = dict(pad_slot_id=-1, device="cpu", topk=0, req_to_token_pool=pool, _fused_state_indices_ok=False,
                 forward_metadata=None, state_indices_list=[], mamba_track_indices_buf=None,
                 replayssm_write_pos_list=None, replayssm_force_flush_list=None, query_start_loc_list=[],
                 retrieve_next_token_list=[], retrieve_next_sibling_list=[], retrieve_parent_token_list=[],
                 _graph_seq_len_fill_value=1)
    for key, value in state.items():
        setattr(linear, key, value)
    linear.init_forward_metadata_out_graph = functools.partial(
        MambaAttnBackendBase.init_forward_metadata_out_graph, linear
    )
    linear.init_cuda_graph_state(MAX_BS, MAX_BS * S)
    hybrid = object.__new__(HybridLinearAttnBackend)
    hybrid.attn_backend_list = [linear]
    state = None
    if wrap:
        state = replay_tree_links(hybrid, linear)
        assert replay_tree_links(hybrid, linear) is state  # idempotent
    return linear, hybrid, state


def verify(linear, hybrid, state, real_bs, links=None, in_capture=False):
    spec_info = SimpleNamespace(draft_token_num=S, ragged_verify_layout=None)
    if links is not None:
        spec_info.retrieve_next_token, spec_info.retrieve_next_sibling = (torch.tensor(t) for t in links)
    fb = SimpleNamespace(batch_size=MAX_BS, req_pool_indices=torch.arange(MAX_BS),
                         forward_mode=ForwardMode.TARGET_VERIFY, spec_info=spec_info,
                         seq_lens_cpu=torch.tensor([9, 9, 9, 1]), num_padding=MAX_BS - real_bs,
                         mamba_track_indices=None)
    hybrid.init_forward_metadata_out_graph(fb, in_capture=in_capture)
    meta = linear.forward_metadata
    return {"tree_path": meta.retrieve_parent_token is not None, "topk_after": linear.topk,
            "next": linear.retrieve_next_token_list[MAX_BS - 1].tolist(),
            "sibling": linear.retrieve_next_sibling_list[MAX_BS - 1].tolist()}


out = {}
for name, wrap in (("wrapped", True), ("plain", False)):
    pair = backends(wrap)
    out[name] = {"capture": verify(*pair, MAX_BS, in_capture=True), "tree": verify(*pair, 3, TREE),
                 "chain": verify(*pair, MAX_BS)}
    out[name]["counts"] = [pair[2].captures, pair[2].replays] if wrap else None
print(json.dumps(out))
"""

CHAIN = ([[1, 2, 3, -1]], [[-1, -1, -1, -1]])


def sglang_probe(tmp: Path) -> Probe:
    """This module's part of the tier's one SGLang probe process (conftest.py, `sglang_probes`)."""
    return Probe(_PROBE)


@pytest.fixture(scope="module")
def probe(sglang_probes: dict[str, ProbeResult]) -> dict[str, dict[str, dict[str, object]]]:
    done = sglang_probes[__name__]
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, dict[str, dict[str, object]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_hybrid_verify_graphs_take_the_tree_path_and_never_replay_stale_links(
    probe: dict[str, dict[str, dict[str, object]]],
) -> None:
    result = probe["wrapped"]
    # captured on the tree path: the graph's GDN kernels read the static links (SGLang's top-k restored after)
    assert result["capture"]["tree_path"] and result["capture"]["topk_after"] == 0
    # a tree round of 3 requests in the batch-4 graph: their links, then a chain for the padding row
    assert result["tree"]["next"] == [[1, 3, -1, -1]] * 3 + CHAIN[0]
    assert result["tree"]["sibling"] == [[-1, 2, -1, -1]] * 3 + CHAIN[1]
    # the next verify brings no links (DFLASH's own round, a self-check's chain re-verify): a chain, not the
    # previous round's tree
    assert result["chain"]["tree_path"]
    assert result["chain"]["next"] == CHAIN[0] * 4 and result["chain"]["sibling"] == CHAIN[1] * 4
    assert result["counts"] == [1, 2]  # what the worker's start-up check and log line read


def test_without_the_wrapper_sglang_captures_the_chain_path(probe: dict[str, dict[str, dict[str, object]]]) -> None:
    """What the wrapper is for: with DFLASH's top-k SGLang's replay step hands the graph no tree links."""
    result = probe["plain"]
    assert not result["capture"]["tree_path"] and not result["tree"]["tree_path"]
