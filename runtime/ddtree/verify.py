"""Tree verify through a transformers causal LM: one forward over every tree node, then KV commit.

The committed prefix lives in a transformers `DynamicCache` (`prefix_len` tokens; the root of the next tree,
the bonus token, is *not* in it yet). `TargetRunner.verify` feeds the tree's N nodes after the prefix with
`position_ids = prefix_len + depth` and a 4D mask `[prefix all-visible | ancestor-only among nodes]`, so every
node sees exactly its own root-to-node path. Attention layers append the N nodes' K/V to the cache;
`TargetRunner.commit` keeps only the accepted nodes' K/V in path order. Gated DeltaNet layers (hybrid targets)
are handled in `ddtree.hybrid`: their tree forward leaves the cache alone and the commit replays the accepted path.

Everything that depends on the transformers version sits in `HFCompat` (see docs/runtime.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ddtree import hybrid
from ddtree.hf_compat import HFCompat
from ddtree.hybrid import HybridMode


class TreeInputsLike(Protocol):
    """What `verify` needs from `ddtree.tree.TreeInputs` (structural, so tests can build trees directly)."""

    @property
    def input_ids(self) -> Tensor: ...  # [N] int64

    @property
    def position_ids(self) -> Tensor: ...  # [N] int64, prefix_len + depth

    @property
    def attention_mask(self) -> Tensor: ...  # [N, N] bool, mask[i, j] = j is i or an ancestor of i

    @property
    def parents(self) -> Tensor: ...  # [N] int64, parents[0] == -1

    @property
    def depth_groups(self) -> tuple[Tensor, ...]: ...  # node ids per depth


@dataclass(frozen=True)
class StepOutput:
    logits: Tensor  # [T, V] fp32
    features: Tensor | None  # [T, F] concatenated hidden states of the requested target layers


def tree_mask_4d(tree_mask: Tensor, prefix_len: int, dtype: torch.dtype) -> Tensor:
    """Additive mask [1, 1, N, prefix_len + N]: 0 where visible, dtype-min where masked.

    Works for eager and SDPA attention (a float mask is added to the scores)."""
    n = tree_mask.shape[0]
    visible = torch.ones(n, prefix_len + n, dtype=torch.bool, device=tree_mask.device)
    visible[:, prefix_len:] = tree_mask
    mask = torch.zeros(n, prefix_len + n, dtype=dtype, device=tree_mask.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]  # [1, 1, N, P + N]


class TargetRunner:
    """Owns the target model's cache for one sequence (batch size 1, tensors batch-shaped).

    prefill -> (decode | verify + commit)*. `prefix_len` counts the tokens whose state is in the cache.
    """

    def __init__(
        self,
        model: Any,  # a transformers causal LM (PreTrainedModel)
        feature_layers: Sequence[int] = (),
        hybrid_mode: HybridMode | None = None,
        gdn_method: hybrid.GDNMethod = hybrid.GDNMethod.CHUNK,
    ) -> None:
        self.model = model
        self.gdn_method = gdn_method
        self.compat = HFCompat.for_model(model)
        self.feature_layers = tuple(feature_layers)
        self.gdn_layers = hybrid.find_gdn_layers(model)
        if hybrid_mode is None:
            hybrid_mode = HybridMode.EXACT if self.gdn_layers else HybridMode.NONE
        if self.gdn_layers and hybrid_mode is HybridMode.NONE:
            raise ValueError("hybrid target needs hybrid_mode exact or unsafe")
        self.hybrid_mode = hybrid_mode if self.gdn_layers else HybridMode.NONE
        self.cache: Any = None
        self.prefix_len = 0
        self._pending: _PendingTree | None = None

    @property
    def device(self) -> torch.device:
        dev: torch.device = next(self.model.parameters()).device
        return dev

    def _features(self, hidden_states: tuple[Tensor, ...] | None) -> Tensor | None:
        if not self.feature_layers or hidden_states is None:
            return None
        # DFlash convention: hidden_states[0] is the embedding output, layer i's output is hidden_states[i + 1]
        return torch.cat([hidden_states[i + 1][0] for i in self.feature_layers], dim=-1)  # [T, F]

    def _run(self, ids: Tensor, positions: Tensor, mask: dict[str, Tensor | None] | None) -> StepOutput:
        out = self.compat.forward(
            self.model,
            ids[None],
            positions[None],
            mask,
            self.cache,
            output_hidden_states=bool(self.feature_layers),
        )
        logits = out.logits[0].float()  # [T, V]
        return StepOutput(logits=logits, features=self._features(out.hidden_states))

    @torch.no_grad()
    def prefill(self, token_ids: Sequence[int]) -> StepOutput:
        """Fresh cache; run the prompt. Returns logits/features for every prompt position."""
        self.cache = self.compat.new_cache(self.model)
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)  # [T]
        positions = torch.arange(len(token_ids), device=self.device)  # [T]
        step = self._run(ids, positions, None)
        self.prefix_len = len(token_ids)
        self._pending = None
        return step

    @torch.no_grad()
    def decode(self, token: int) -> StepOutput:
        """Plain transformers decode step (the baseline path): append one token to the cache."""
        self._require_no_pending()
        ids = torch.tensor([token], dtype=torch.long, device=self.device)
        positions = torch.tensor([self.prefix_len], device=self.device)
        step = self._run(ids, positions, None)
        self.prefix_len += 1
        return step

    @torch.no_grad()
    def verify(self, inputs: TreeInputsLike) -> StepOutput:
        """One target forward over all N tree nodes. Returns logits [N, V] (and features [N, F]).

        The cache is left holding the N nodes' attention K/V until `commit`."""
        self._require_no_pending()
        dev = self.device
        ids = inputs.input_ids.to(dev)  # [N]
        positions = inputs.position_ids.to(dev)  # [N]
        mask4d = tree_mask_4d(inputs.attention_mask.to(dev), self.prefix_len, self.model.dtype)
        masks: dict[str, Tensor | None] = {
            "full_attention": mask4d,
            "sliding_attention": mask4d,
            "linear_attention": None,
        }
        stashes: dict[int, hybrid.GDNStash] = {}
        if self.gdn_layers:
            plan = hybrid.GDNPlan.build(
                inputs.parents.to(dev),
                inputs.depth_groups,
                conv_kernel=self.gdn_layers[0].conv_kernel_size,
                flat=self.hybrid_mode is HybridMode.UNSAFE,
                method=self.gdn_method,
            )
            with hybrid.tree_gdn(self.gdn_layers, plan, self.compat) as stashes:
                step = self._run(ids, positions, masks)
        else:
            step = self._run(ids, positions, masks)
        self._pending = _PendingTree(n_nodes=int(ids.shape[0]), gdn=stashes)
        return step

    @torch.no_grad()
    def commit(self, accepted: Sequence[int]) -> None:
        """Keep the accepted nodes (path order, starting at the root) and drop the rest of the tree."""
        pending = self._pending
        if pending is None:
            raise RuntimeError("commit without a pending verify")
        if not accepted or accepted[0] != 0:
            raise ValueError(f"accepted path must start at the root (node 0), got {tuple(accepted)}")
        path = torch.tensor(list(accepted), dtype=torch.long, device=self.device)  # [A]
        keep = torch.cat([torch.arange(self.prefix_len, device=self.device), self.prefix_len + path])
        for layer in self.compat.kv_layers(self.cache):
            if layer.keys.shape[-2] != self.prefix_len + pending.n_nodes:
                raise RuntimeError(
                    f"KV cache length {layer.keys.shape[-2]} != prefix {self.prefix_len} + nodes {pending.n_nodes}"
                )
            # keys/values: [B, H_kv, P + N, D] -> [B, H_kv, P + A, D]
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)
        if pending.gdn:
            hybrid.commit_gdn(self.gdn_layers, pending.gdn, path, self.cache, self.compat)
        self.prefix_len += len(accepted)
        self._pending = None

    def _require_no_pending(self) -> None:
        if self._pending is not None:
            raise RuntimeError("a verified tree is pending: call commit() first")


@dataclass(frozen=True)
class _PendingTree:
    n_nodes: int
    gdn: dict[int, hybrid.GDNStash]
