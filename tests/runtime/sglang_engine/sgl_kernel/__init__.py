"""Stand-in for the CPU build of `sgl_kernel`, for SGLang's engine in CI (docs/ci.md, "SGLang's engine on
CPU, in CI").

With `SGLANG_USE_CPU_ENGINE=1`, SGLang 0.5.23 imports a few `*_cpu` ops from `sgl_kernel` at module level
(`sglang/srt/mem_cache/allocation.py:46`, `sglang/kernels/ops/kvcache/cache_move.py:10`,
`sglang/kernels/ops/speculative/cache_locs.py:28`). The CPU build of sgl_kernel is not on PyPI, so this package
serves the ops SGLang's CPU path really calls on the test's tiny dense model from pure-torch fallbacks
(`fallbacks.py`); any other op can still be imported (SGLang imports more than it calls) but raises
`NotImplementedError` naming itself when called, so a new dependency fails loudly, never silently.

The hybrid (Gated DeltaNet) target needs more: `torch.ops.sgl_kernel.*_cpu` ops looked up at import by
`sglang/srt/models/qwen3_5.py`, `.../attention/linear/gdn_backend.py` and `.../linear/kernels/gdn_triton.py`
(`triton_routes.py`, put on torch's op namespace when this package is imported, which SGLang does before any
model module), and `sgl_kernel.mamba`'s conv1d and chunked delta-rule ops (`mamba.py`). Where SGLang has a
Triton kernel for the op and it runs here (interpreted), the op is that kernel; otherwise pure torch, with the
reason in its docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import fallbacks, triton_routes

__version__ = "0.0.0+ddtree-ci-stub"

triton_routes.install()  # torch.ops.sgl_kernel.*_cpu for a hybrid (Gated DeltaNet) target


def _missing(name: str) -> Callable[..., Any]:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel stub (tests/runtime/sglang_engine): op {name!r} is not provided; "
            "add a pure-torch fallback to sgl_kernel/fallbacks.py"
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name in fallbacks.PROVIDED:
        return getattr(fallbacks, name)
    return _missing(name)
