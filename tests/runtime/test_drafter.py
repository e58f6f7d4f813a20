"""DFlash drafter: shapes, non-causal block, context caching, train/inference mask agreement, save/load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ddtree.drafter import (
    DFlashDraftConfig,
    DFlashDraftModel,
    block_attention_mask,
    build_target_layer_ids,
    extract_context_feature,
    load_drafter,
)
from torch import nn

pytestmark = pytest.mark.runtime

V, H, S = 40, 32, 6  # vocab, hidden, block size
MASK_ID = 39
LAYER_IDS = [1, 2]


def make_drafter(seed: int = 0) -> DFlashDraftModel:
    torch.manual_seed(seed)
    cfg = DFlashDraftConfig(
        architectures=["DFlashDraftModel"],
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        initializer_range=0.2,  # large init so the assertions below see clear signal
        block_size=S,
        num_target_layers=4,
        dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": LAYER_IDS},
    )
    return DFlashDraftModel(cfg).eval()


@pytest.fixture
def parts() -> tuple[DFlashDraftModel, nn.Embedding, nn.Linear]:
    torch.manual_seed(1)
    return make_drafter(), nn.Embedding(V, H), nn.Linear(H, V, bias=False)


def test_draft_logprobs_shape_and_normalised(parts: tuple[DFlashDraftModel, nn.Embedding, nn.Linear]) -> None:
    drafter, embed, head = parts
    feats = torch.randn(3, 7, len(LAYER_IDS) * H)  # [B, T, L*H]
    lp = drafter.draft_logprobs(feats, torch.tensor([1, 2, 3]), embed, head)
    assert lp.shape == (3, S - 1, V)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(3, S - 1))
    # rows of the batch with different bonus tokens draft different things
    assert not torch.allclose(lp[0], lp[1])


def test_block_is_not_causal(parts: tuple[DFlashDraftModel, nn.Embedding, nn.Linear]) -> None:
    """Changing the LAST block slot's input changes the FIRST slots' outputs (a causal stack could not)."""
    drafter, embed, _ = parts
    kv = drafter.context_kv(torch.randn(1, 5, len(LAYER_IDS) * H))
    pos = torch.arange(5, 5 + S).unsqueeze(0)
    x = embed(drafter.block_input_ids(torch.tensor([4])))  # [1, S, H]
    y = x.clone()
    y[:, -1] += 1.0
    out_x, out_y = drafter(x, pos, kv), drafter(y, pos, kv)
    assert (out_x[:, 0] - out_y[:, 0]).abs().max() > 1e-3
    assert (out_x[:, 1] - out_y[:, 1]).abs().max() > 1e-3


def test_context_matters_and_cache_matches_recompute(
    parts: tuple[DFlashDraftModel, nn.Embedding, nn.Linear],
) -> None:
    drafter, embed, head = parts
    feats = torch.randn(1, 9, len(LAYER_IDS) * H)
    bonus = torch.tensor([7])
    full = drafter.draft_logprobs(feats, bonus, embed, head)
    other = drafter.draft_logprobs(torch.randn_like(feats), bonus, embed, head)
    assert (full - other).abs().max() > 1e-3

    ctx = drafter.new_context()
    for lo, hi in [(0, 4), (4, 5), (5, 9)]:  # prompt, then rounds committing 1 and 4 tokens
        drafter.extend_context(ctx, feats[:, lo:hi])
    assert ctx.length == 9
    torch.testing.assert_close(drafter.draft_logprobs_cached(ctx, bonus, embed, head), full, rtol=1e-5, atol=1e-5)

    ctx.truncate(4)
    torch.testing.assert_close(
        drafter.draft_logprobs_cached(ctx, bonus, embed, head),
        drafter.draft_logprobs(feats[:, :4], bonus, embed, head),
        rtol=1e-5,
        atol=1e-5,
    )


def test_training_mask_matches_inference(parts: tuple[DFlashDraftModel, nn.Embedding, nn.Linear]) -> None:
    """Blocks packed in one masked forward equal separate inference forwards over context[:anchor]."""
    drafter, embed, head = parts
    t = 12
    feats = torch.randn(1, t, len(LAYER_IDS) * H)
    tokens = torch.randint(0, MASK_ID, (1, t))
    anchors = torch.tensor([[3, 8, 11]])  # [B, m]
    m = anchors.shape[1]
    ids = torch.stack([drafter.block_input_ids(tokens[:, a]) for a in anchors[0]], dim=1)  # [1, m, S]
    pos = (anchors.unsqueeze(-1) + torch.arange(S)).reshape(1, m * S)
    packed = drafter(embed(ids.reshape(1, m * S)), pos, drafter.context_kv(feats), block_attention_mask(t, anchors, S))
    packed_lp = torch.log_softmax(head(packed.reshape(1, m, S, H)[:, :, 1:]), dim=-1)  # [1, m, S-1, V]
    for j, a in enumerate(anchors[0].tolist()):
        alone = drafter.draft_logprobs(feats[:, :a], tokens[:, a], embed, head)  # bonus at position a
        torch.testing.assert_close(packed_lp[:, j], alone, rtol=1e-4, atol=1e-5)


def test_block_attention_mask_layout() -> None:
    mask = block_attention_mask(4, torch.tensor([[1, 3]]), 2)  # [1, 4, 4 + 4]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 1, 1, 0, 0],
            [1, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 1, 0, 0, 0, 1, 1],
            [1, 1, 1, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask[0], expected)


def test_save_load_round_trip(tmp_path: Path, parts: tuple[DFlashDraftModel, nn.Embedding, nn.Linear]) -> None:
    drafter, embed, head = parts
    drafter.save_pretrained(str(tmp_path))
    raw = json.loads((tmp_path / "config.json").read_text())
    # the published DFlash checkpoint layout (what SGLang's DFLASH loader reads)
    assert raw["architectures"] == ["DFlashDraftModel"]
    assert raw["model_type"] == "qwen3"
    assert raw["block_size"] == S
    assert raw["dflash_config"] == {"mask_token_id": MASK_ID, "target_layer_ids": LAYER_IDS}
    loaded = load_drafter(tmp_path)
    assert not loaded.training
    assert (loaded.block_size, loaded.mask_token_id, loaded.target_layer_ids) == (S, MASK_ID, LAYER_IDS)
    names = set(loaded.state_dict())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)  # shared with the target, never stored
    for name, value in drafter.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name
    feats = torch.randn(1, 5, len(LAYER_IDS) * H)
    bonus = torch.tensor([3])
    assert torch.equal(
        drafter.draft_logprobs(feats, bonus, embed, head), loaded.draft_logprobs(feats, bonus, embed, head)
    )


def test_load_rejects_unknown_architecture(tmp_path: Path) -> None:
    make_drafter().save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no known drafter"):
        load_drafter(tmp_path)


def test_top_level_dflash_fields_are_read() -> None:
    """Some published drafters keep mask_token_id / target_layer_ids at the top level."""
    cfg = DFlashDraftConfig(hidden_size=H, num_hidden_layers=1, mask_token_id=5, target_layer_ids=[0, 3])
    assert cfg.draft_mask_token_id() == 5
    assert cfg.draft_target_layer_ids() == [0, 3]


def test_default_layer_choice_and_feature_extraction() -> None:
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # as published for a 64-layer target
    assert build_target_layer_ids(36, 1) == [18]
    hs = tuple(torch.full((1, 2, 3), float(i)) for i in range(5))  # embeddings + 4 layers
    feats = extract_context_feature(hs, [0, 2])
    assert feats.shape == (1, 2, 6)
    assert feats[0, 0].tolist() == [1.0, 1.0, 1.0, 3.0, 3.0, 3.0]  # index i+1 = output of layer i
