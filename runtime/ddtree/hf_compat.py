"""How the installed transformers spells its cache API, in one place (`HFCompat`): the tree verify
(`ddtree.verify`) and the hybrid layers' tree forward and commit (`ddtree.hybrid`) both read the cache through it
(docs/runtime.md)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class HFCompat:
    """The one place that knows how the installed transformers spells its cache API.

    transformers 5.17 takes `past_key_values=` in `forward`; later 5.x take `cache=` (and warn on the old name).
    Both store attention K/V as `cache.layers[i].keys/.values` [B, H_kv, S, D] and Gated DeltaNet states as
    `cache.layers[i].conv_states[0]` [B, C, K] (the last K pre-conv inputs) and `.recurrent_states[0]`
    [B, H_v, d_k, d_v] (fp32).
    """

    cache_kwarg: str  # "cache" | "past_key_values"

    @classmethod
    def for_model(cls, model: Any) -> HFCompat:
        params = inspect.signature(model.forward).parameters
        return cls(cache_kwarg="cache" if "cache" in params else "past_key_values")

    @staticmethod
    def new_cache(model: Any) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=model.config)

    def forward(
        self,
        model: Any,
        input_ids: Tensor,  # [1, T]
        position_ids: Tensor,  # [1, T]
        attention_mask: dict[str, Tensor | None] | None,
        cache: Any,
        output_hidden_states: bool,
    ) -> Any:
        kwargs = {self.cache_kwarg: cache}
        return model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )

    @staticmethod
    def kv_layers(cache: Any) -> list[Any]:
        """Cache layers holding attention K/V (skips linear-attention-only layers)."""
        return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0]

    @staticmethod
    def gdn_state(cache: Any, layer_idx: int) -> tuple[Tensor, Tensor]:
        layer = cache.layers[layer_idx]
        return layer.conv_states[0], layer.recurrent_states[0]

    @staticmethod
    def set_gdn_state(cache: Any, layer_idx: int, conv: Tensor, recurrent: Tensor) -> None:
        layer = cache.layers[layer_idx]
        # copy_ keeps the tensors' addresses (transformers marks them static for CUDA graphs)
        layer.conv_states[0].copy_(conv)
        layer.recurrent_states[0].copy_(recurrent)
