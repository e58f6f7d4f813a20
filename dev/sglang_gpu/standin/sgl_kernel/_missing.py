"""A stand-in for any op this package does not provide: importable, fails loudly when called."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def missing(qualified: str) -> Callable[..., Any]:
    """A function named after `qualified` that raises NotImplementedError naming it."""

    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{qualified} is not provided by the torch sgl_kernel stand-in (dev/sglang_gpu/sgl_kernel); "
            "add it to sgl_kernel/ops.py with sgl_kernel's semantics, or avoid the code path"
        )

    op.__name__ = op.__qualname__ = qualified.rsplit(".", 1)[-1]
    return op


def module_getattr(module: str) -> Callable[[str], Any]:
    """A module-level `__getattr__` for a stub submodule: every public name is a `missing` op."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return missing(f"{module}.{name}")

    return __getattr__
