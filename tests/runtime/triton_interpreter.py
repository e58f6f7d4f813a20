"""A faster Triton interpreter for the CPU test tiers: a device-function call (a `@triton.jit` helper called
from inside a kernel) skips re-patching `triton.language` when the running kernel already patched the same
modules, and a kernel launch replays the attributes the first launch over the same modules set (the patched
members are closures over the originals and the interpreter's semantic: nothing launch-specific) instead of
walking the modules with `inspect.getmembers` again.

Triton 3.x's interpreter (`triton/runtime/interpreter.py`, `InterpretedFunction.__call__`) calls `_patch_lang`
on every device-function call: `inspect.getmembers` over `triton.language`, its `tensor`, `math` and `core`,
each member tested with `is_builtin`, for every call in every program of the grid (and that scope is never
restored: the enclosing kernel's restore undoes it). Inside a running kernel those modules are already patched
(the grid executor patched them before its first program), and the repeated pass finds no builtin left to wrap,
so skipping it changes no value a kernel computes; it was a quarter of SGLang's hybrid verify on the CPU
(py-spy: `_getmembers`, `is_builtin`, `_patch_attr`). Installed triton files are never edited.

Three more costs go, each without changing a value or a check (docs/ci.md, "Triton's interpreter"):
- integer `+`, `-` and `*` built an overflow check (casts to int64, the operation again, two compares, an and) whose
  only use is a `device_assert`, which Triton drops unless the kernel runs with `debug` (never, here; nor in a
  compiled kernel on a GPU). Without `debug` the check is now not built: 4 in 10 of SGLang's extend-attention
  kernel's interpreted time went there.
- `_get_np_dtype` built a 20-entry dict of numpy dtypes on every call (every cast, splat, load and store): its
  answers are now looked up once per Triton dtype.
- every operation builds its result's `block_type`, whose shape is a `triton.language.tuple` (typed, named,
  validated) built anew each time: a block type's shape, size and name are now computed once per (element type,
  shape) and shared (nothing in triton changes a block type's shape in place). The hybrid target's tree run
  7% faster (Gated DeltaNet's verify kernel builds them in every step of its token loop).
"""

from __future__ import annotations

import inspect
from typing import Any

_active: list[set[int]] = []  # per running kernel (nested grids are possible): ids of the patched modules


_ids_of_globals: dict[int, tuple[int, frozenset[int]]] = {}  # id(globals) -> (its size then, the ids)


def _lang_ids(fn: Any) -> frozenset[int]:
    """The ids of triton.language and triton.language.core among `fn`'s globals: looked up once per module (and
    again if its globals grew), not on every device call."""
    import triton.language as tl

    space = fn.__globals__
    seen = _ids_of_globals.get(id(space))
    if seen is None or seen[0] != len(space):
        ids = frozenset(id(v) for v in space.values() if inspect.ismodule(v) and v in (tl, tl.core))
        seen = _ids_of_globals[id(space)] = (len(space), ids)
    return seen[1]


def install() -> bool:
    """Patch the interpreter in this process (idempotent). False when triton (or its interpreter) is absent."""
    try:
        import triton.runtime.interpreter as interp
    except ImportError:
        return False
    if getattr(interp, "_opsctl_fast_device_calls", False):
        return True
    original = interp._patch_lang

    class _Scope:
        """The grid executor's patch scope: restoring it also ends the kernel's entry in `_active`."""

        def __init__(self, inner: Any, ids: frozenset[int]) -> None:
            self.inner, self.ids = inner, set(ids)
            _active.append(self.ids)

        def restore(self) -> None:
            if _active and _active[-1] is self.ids:
                _active.pop()
            self.inner.restore()

    replay: dict[frozenset[int], list[tuple[object, str, object]]] = {}  # lang ids -> the attributes a launch sets

    def launch_scope(fn: Any, ids: frozenset[int]) -> Any:
        """A launch's patches: computed once per set of modules (getmembers over triton.language), then the same
        attributes set again, into a fresh scope that restores them as the original one would."""
        if ids not in replay:
            scope = original(fn)
            replay[ids] = [(obj, name, getattr(obj, name)) for obj, name, _ in scope._changes]
            return scope
        scope = interp._LangPatchScope()
        for obj, name, value in replay[ids]:
            scope.set_attr(obj, name, value)
        return scope

    def patch_lang(fn: Any) -> Any:
        ids = _lang_ids(fn)
        if not _active:  # a kernel launch (the grid executor restores the scope when its grid is done)
            return _Scope(launch_scope(fn, ids), ids)
        if ids <= _active[-1]:  # a device call inside it, the same modules: already patched, nothing to undo
            return interp._LangPatchScope()
        scope = original(fn)  # a device call seeing other modules: patched until the kernel's restore, as before
        _active[-1] |= ids
        return scope

    interp._patch_lang = patch_lang
    _skip_overflow_checks_without_debug()
    _cache_numpy_dtypes(interp)
    _cache_block_types()
    interp._opsctl_fast_device_calls = True
    return True


def _skip_overflow_checks_without_debug() -> None:
    """The overflow check's only effect is `device_assert`, a no-op without `debug` (triton/language/semantic.py
    `device_assert` returns at once): with `debug` off, skip building it."""
    from triton.language import semantic

    check = semantic.TritonSemantic.binary_op_sanitize_overflow_impl

    def sanitize_overflow(self: Any, lhs: Any, rhs: Any, binary_op: Any) -> None:
        if self.builder.options.debug:
            check(self, lhs, rhs, binary_op)

    semantic.TritonSemantic.binary_op_sanitize_overflow_impl = sanitize_overflow


def _cache_numpy_dtypes(interp: Any) -> None:
    """`_get_np_dtype` maps a Triton dtype (a block's: its element's) to a numpy one; the same answer every time."""
    import triton.language as tl

    slow = interp._get_np_dtype
    known: dict[Any, Any] = {}

    def np_dtype(tt_dtype: Any) -> Any:
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty  # what the original does with a block (a block of pointers: uint64)
        if isinstance(tt_dtype, tl.pointer_type):
            return slow(tt_dtype)
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = slow(tt_dtype)
            return known[tt_dtype]

    interp._get_np_dtype = np_dtype


def _cache_block_types() -> None:
    """`block_type(element_ty, shape)`: its shape (a triton tuple), numel and name computed and validated once per
    (element type, shape), then assigned. What is not cached (an unhashable element type, such as a pointer's, or
    a shape that is neither a list nor a triton tuple) and a shape the original refuses go through the original
    every time."""
    import triton.language as tl

    build = tl.block_type.__init__
    known: dict[tuple[Any, ...], tuple[Any, int, str]] = {}

    def init(self: Any, element_ty: Any, shape: Any) -> None:
        key: tuple[Any, ...] | None = None
        if isinstance(shape, (list, tl.tuple)):  # what the original accepts (`tuple` there is triton's)
            key = (element_ty, *(s.value if isinstance(s, tl.constexpr) else s for s in shape))
            try:
                attrs = known.get(key)
            except TypeError:
                key = attrs = None
            if attrs is not None:
                self.element_ty = element_ty
                self.shape, self.numel, self.name = attrs
                return
        build(self, element_ty, shape)
        if key is not None:
            known[key] = (self.shape, self.numel, self.name)

    tl.block_type.__init__ = init
