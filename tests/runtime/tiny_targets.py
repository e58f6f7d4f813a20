"""Tiny random-weight targets built straight from transformers configs (no files, no tokenizer), and the
reference computations the verify tests compare against. Shared by test_verify/test_hybrid/test_lossless/
test_sampling.

Weight init 0.05 by default: with larger random weights (0.2) the hybrid model is badly conditioned in fp32
(measured: two valid evaluation orders of the same path, e.g. a batched tree forward and one-token decode
steps, differ by up to 2e-5 relative), which would make a 1e-5 bound test rounding, not the tree logic.
At 0.05 the same sweep stays below 2e-6; the flat-order (unsafe) error stays above 0.3."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Sequence

import pytest
import torch
from ddtree.tree import DraftTree, build_tree
from ddtree.verify import TargetRunner
from torch import Tensor, nn

HYBRID_LAYERS = ("linear_attention", "linear_attention", "full_attention", "linear_attention")


def _quiet(build: type, config: object) -> nn.Module:
    # transformers logs (not warns) about missing fused kernels; keep construction deterministic and quiet
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(config).eval()


def dense_target(vocab: int = 64, seed: int = 0, init: float = 0.05) -> nn.Module:
    """Qwen3 (all full attention): 2 layers, hidden 32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        initializer_range=init,
        max_position_embeddings=512,
    )
    return _quiet(Qwen3ForCausalLM, cfg)


def hybrid_target(vocab: int = 64, seed: int = 0, init: float = 0.05) -> nn.Module:
    """Qwen3.5 text model: 3 Gated DeltaNet layers (conv kernel 4, 2 k-heads, 4 v-heads) + 1 attention layer."""
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(HYBRID_LAYERS),
        layer_types=list(HYBRID_LAYERS),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        initializer_range=init,
        max_position_embeddings=512,
    )
    return _quiet(Qwen3_5ForCausalLM, cfg)


def root_paths(parents: Sequence[int]) -> list[list[int]]:
    """For every node, its root-to-node path of node ids."""
    paths: list[list[int]] = []
    for i, p in enumerate(parents):
        paths.append([0] if p < 0 else [*paths[p], i])
    return paths


def reference_logits(model: nn.Module, prefix: Sequence[int], tree: DraftTree) -> Tensor:
    """Logits [N, V] where row i comes from running node i's root-to-node path on its own after the prefix:
    prefill the prefix, then one plain transformers decode step per path token (the baseline's own path).
    Depth-first over the tree with a copy of the cache per branch, so each node is decoded once."""
    parents = tree.parents.tolist()
    tokens = tree.tokens.tolist()
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(i)
    out = torch.empty(len(parents), model.config.vocab_size)
    runner = TargetRunner(model)
    runner.prefill(prefix)
    stack = [(0, runner.cache, runner.prefix_len)]
    while stack:
        node, cache, length = stack.pop()
        runner.cache, runner.prefix_len = cache, length
        out[node] = runner.decode(tokens[node]).logits[-1]
        kids = children.get(node, [])
        for j, kid in enumerate(kids):
            # the last child may take the cache itself; the others get their own copy
            branch = runner.cache if j == len(kids) - 1 else copy.deepcopy(runner.cache)
            stack.append((kid, branch, runner.prefix_len))
    return out


@torch.no_grad()
def sequence_logits(model: nn.Module, prefix: Sequence[int], tree: DraftTree) -> Tensor:
    """Like reference_logits, but each leaf path runs as one cache-free sequence forward (transformers'
    chunked GDN algorithm: an independent computation, fp32 rounding differs from the decode path)."""
    parents = tree.parents.tolist()
    tokens = tree.tokens.tolist()
    paths = root_paths(parents)
    has_child = {p for p in parents if p >= 0}
    out = torch.empty(len(parents), model.config.vocab_size)
    for leaf in (i for i in range(len(parents)) if i not in has_child):
        ids = torch.tensor([[*prefix, *(tokens[n] for n in paths[leaf])]])
        logits = model(input_ids=ids).logits[0]  # [T, V]
        for j, node in enumerate(paths[leaf]):
            out[node] = logits[len(prefix) + j]
    return out


@pytest.fixture(scope="module", autouse=False)
def one_thread() -> Iterator[None]:
    """The test machine's cores are shared: one intra-op thread is several times faster than two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rel_err(a: Tensor, b: Tensor) -> Tensor:
    """Per-row max |a - b| / max |b|: [N]."""
    return (a - b).abs().amax(dim=-1) / b.abs().amax(dim=-1)


def random_tree(vocab: int, seed: int, depth: int, budget: int, topk: int) -> tuple[list[int], DraftTree]:
    """A seeded random prompt and a DDTree built from random drafter log-probs (shared by the verify tests)."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(2.0 * torch.randn(depth, vocab, generator=g), dim=-1)  # [D, V]
    prompt = torch.randint(0, vocab, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
    root = int(torch.randint(0, vocab, (1,), generator=g))
    return prompt, build_tree(lp, root, budget, topk)
