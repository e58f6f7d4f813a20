"""The torch `sgl_kernel` stand-in of the GPU harness (dev/sglang_gpu/standin/sgl_kernel) against SGLang 0.5.23's
own torch implementations (`forward_native`) of the same layers, on CPU tensors, float32 and bfloat16.

SGLang is never imported into the pytest process, so each reference below is SGLang's `forward_native`
transcribed (file:line in the 0.5.23 wheel). The stand-in is loaded from its file under another module name, so
it cannot shadow the CPU engine test's `sgl_kernel` stub.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.runtime

STANDIN = Path(__file__).resolve().parents[2] / "dev" / "sglang_gpu" / "standin" / "sgl_kernel"
DTYPES = [torch.float32, torch.bfloat16]


def _load_standin() -> ModuleType:
    name = "ddtree_gpu_standin_sgl_kernel"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, STANDIN / "__init__.py", submodule_search_locations=[str(STANDIN)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sk = _load_standin()


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: equal to rounding; bfloat16: within two bf16 ulps (the reference rounds at other steps)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 * 2**-8, atol=2e-2)


def _inputs(dtype: torch.dtype, tokens: int = 7, hidden: int = 96) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(tokens, hidden, generator=g) * 3).to(dtype)
    residual = torch.randn(tokens, hidden, generator=g).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    return x, residual, weight


def rmsnorm_native(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`sglang/srt/layers/layernorm.py:828-880` (RMSNorm.forward_native, no variance override, no fp32 residual)."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    if residual is not None:
        x = x + residual.to(torch.float32)
        residual = x.to(orig_dtype)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    x = (x * weight).to(orig_dtype)
    return x if residual is None else (x, residual)


def gemma_rmsnorm_native(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`sglang/srt/layers/layernorm.py:1152-1168` (GemmaRMSNorm.forward_native)."""
    orig_dtype = x.dtype
    if residual is not None:
        x = x + residual
        residual = x
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    x = (x * (1.0 + weight.float())).to(orig_dtype)
    return x if residual is None else (x, residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_returns_native_and_writes_out(dtype: torch.dtype) -> None:
    x, _, weight = _inputs(dtype)
    before = x.clone()
    want = rmsnorm_native(x, weight, 1e-6)
    assert isinstance(want, torch.Tensor)
    _close(sk.rmsnorm(x, weight, 1e-6), want)
    out = torch.empty_like(x)
    assert sk.rmsnorm(x, weight, 1e-6, out=out) is out
    _close(out, want)
    assert torch.equal(x, before)  # input untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rmsnorm_is_in_place_like_native(dtype: torch.dtype) -> None:
    """layernorm.py:638-639 calls `fused_add_rmsnorm(x, residual, w, eps)` and returns `(x, residual)`: both are
    written in place, x the normed sum, residual the sum."""
    x, residual, weight = _inputs(dtype)
    want_x, want_residual = rmsnorm_native(x.clone(), weight, 1e-6, residual.clone())
    assert sk.fused_add_rmsnorm(x, residual, weight, 1e-6) is None
    _close(x, want_x)
    _close(residual, want_residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_rmsnorm_and_fused_add(dtype: torch.dtype) -> None:
    x, residual, weight = _inputs(dtype)
    want = gemma_rmsnorm_native(x, weight - 1.0, 1e-6)  # a weight around 0, as Gemma checkpoints store it
    assert isinstance(want, torch.Tensor)
    _close(sk.gemma_rmsnorm(x, weight - 1.0, 1e-6), want)
    want_x, want_residual = gemma_rmsnorm_native(x.clone(), weight - 1.0, 1e-6, residual.clone())
    assert sk.gemma_fused_add_rmsnorm(x, residual, weight - 1.0, 1e-6) is None
    _close(residual, want_residual)
    _close(x, want_x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("op", "native"),
    [
        ("silu_and_mul", lambda x, d: F.silu(x[..., :d]) * x[..., d:]),  # activation.py:141-143
        ("gelu_and_mul", lambda x, d: F.gelu(x[..., :d], approximate="none") * x[..., d:]),  # :242
        ("gelu_tanh_and_mul", lambda x, d: F.gelu(x[..., :d], approximate="tanh") * x[..., d:]),  # :242
    ],
)
def test_act_and_mul_fills_out_like_native(op: str, native: object, dtype: torch.dtype) -> None:
    """activation.py:93-98: `_act_and_mul` allocates `out` [..., d] and calls `op(input, out)`."""
    x, _, _ = _inputs(dtype, hidden=128)
    want = native(x, 64)  # type: ignore[operator]
    out = torch.empty(x.shape[0], 64, dtype=dtype)
    assert getattr(sk, op)(x, out) is out
    _close(out, want)
    _close(getattr(sk, op)(x), want)


def _cos_sin_cache(rotary_dim: int, positions: int, base: float = 10000.0) -> torch.Tensor:
    """`sglang/srt/layers/rotary_embedding/base.py:233-266`: [positions, rotary_dim] = cat(cos, sin)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.einsum("i,j -> ij", torch.arange(positions, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def rope_native(
    positions: torch.Tensor, x: torch.Tensor, cache: torch.Tensor, head_size: int, rotary_dim: int, neox: bool
) -> torch.Tensor:
    """`base.py:321-362` (RotaryEmbedding.forward_native) with `rotary_embedding/utils.py:36-62`
    (apply_rotary_emb), for one of query / key."""
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    shape = x.shape
    x = x.view(positions.shape[0], -1, head_size)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    if neox:
        x1, x2 = torch.chunk(rot, 2, dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat((o1, o2), dim=-1) if neox else torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rotary_embedding_in_place_like_native(dtype: torch.dtype, neox: bool, rotary_dim: int) -> None:
    head_size, tokens = 32, 5
    g = torch.Generator().manual_seed(1)
    positions = torch.tensor([0, 3, 17, 4, 100])
    query = torch.randn(tokens, 4 * head_size, generator=g).to(dtype)
    key = torch.randn(tokens, 2, head_size, generator=g).to(dtype)  # 3-D, as some call sites pass it
    cache = _cos_sin_cache(rotary_dim, 128).to(dtype)  # base.py:527-531 casts the cache to the query's dtype
    want_q = rope_native(positions, query.clone(), cache, head_size, rotary_dim, neox)
    want_k = rope_native(positions, key.clone(), cache, head_size, rotary_dim, neox)
    assert sk.rotary_embedding(positions, query, key, head_size, cache, neox) is None
    _close(query, want_q)
    _close(key, want_k)


def test_unknown_ops_import_but_fail_loudly_and_pdl_is_off() -> None:
    from importlib import import_module

    op = sk.moe_sum  # imported at module level by SGLang's gguf support
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.moe_sum"):
        op(torch.zeros(1))
    quantization = import_module(f"{sk.__name__}.quantization")
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.quantization\.ggml_dequantize"):
        quantization.ggml_dequantize()
    utils = import_module(f"{sk.__name__}.utils")
    assert utils.is_arch_support_pdl() is False
    with pytest.raises(ModuleNotFoundError):  # SGLang's quantization/utils.py:27 must fall back to its mock
        import_module(f"{sk.__name__}.scalar_type")
    x = torch.arange(6.0).view(2, 3)
    ref = sk.weak_ref_tensor(x)
    assert ref.data_ptr() == x.data_ptr() and ref.shape == x.shape and ref.stride() == x.stride()
