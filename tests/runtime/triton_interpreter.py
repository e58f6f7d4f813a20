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

Five more costs go, each without changing a value or a check (docs/ci.md, "Triton's interpreter"):
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
- every value's `tensor.__init__` turned its type's shape into a fresh triton tuple of constexprs: a tensor of a
  cached block type (or a scalar) now takes its shape record's shared one (`_ShapeRecord`, one per distinct shape).
- `broadcast_impl_value` compared two blocks' shapes dimension by dimension through triton tuples before returning
  them unchanged: blocks with the same shape record return at once (a fifth of the extend-attention kernel).
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
    _cache_tensor_shapes()
    _same_shape_needs_no_broadcast()
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


# A cached block type carries its shape's record here: one object per distinct shape (whatever the element
# type), so two block types have equal shapes when their records are the same object.
SHAPE_ATTR = "_opsctl_shape"


class _ShapeRecord:
    """What every tensor and block type of one shape would otherwise build anew: the block type's shape (a
    triton tuple of ints) and numel, and a tensor's shape (a triton tuple of constexprs) and numel (a constexpr)."""

    def __init__(self, block_shape: Any, numel: int) -> None:
        import triton.language as tl

        self.block_shape, self.numel = block_shape, numel
        self.tensor_shape = tl.tuple([tl.constexpr(s) for s in block_shape])
        self.tensor_numel = tl.constexpr(numel)


def _cache_block_types() -> None:
    """`block_type(element_ty, shape)`: its shape (a triton tuple), numel and name computed and validated once per
    (element type, shape), then assigned, with the shape's record. A block of pointers (their element type is not
    hashable) goes through the original every time but shares its shape's record; a shape that is neither a list
    nor a triton tuple, and a shape the original refuses, go through the original (which raises)."""
    import triton.language as tl

    build = tl.block_type.__init__
    shapes: dict[tuple[Any, ...], _ShapeRecord] = {}
    names: dict[tuple[Any, ...], str] = {}

    def init(self: Any, element_ty: Any, shape: Any) -> None:
        if not isinstance(shape, (list, tl.tuple)):  # what the original accepts (`tuple` there is triton's)
            build(self, element_ty, shape)  # refuses it
            return
        dims = tuple(s.value if isinstance(s, tl.constexpr) else s for s in shape)
        try:
            record = shapes.get(dims)
        except TypeError:  # not a shape of ints: the original says what is wrong
            build(self, element_ty, shape)
            return
        key: tuple[Any, ...] | None = (element_ty, *dims)
        try:
            name = names.get(key)
        except TypeError:  # a pointer's element type is not hashable: its name is built every time
            key = name = None
        if name is not None and record is not None:
            self.element_ty = element_ty
            self.shape, self.numel, self.name = record.block_shape, record.numel, name
        else:
            build(self, element_ty, shape)  # validates the shape (a refused one raises here)
            if record is None:
                record = shapes[dims] = _ShapeRecord(self.shape, self.numel)
            if key is not None:
                names[key] = self.name
        setattr(self, SHAPE_ATTR, record)

    tl.block_type.__init__ = init


def _cache_tensor_shapes() -> None:
    """`tensor(handle, type)` turned its type's shape into a fresh triton tuple of constexprs (and its numel into a
    constexpr) for every value every operation makes; a tensor of a cached block type, or of a scalar type, now
    takes its shape's shared ones. The attributes set are the original's, with equal values."""
    import triton.language as tl

    build = tl.tensor.__init__
    scalar = _ShapeRecord(tl.tuple([]), 1)

    def init(self: Any, handle: Any, type: Any) -> None:
        record = getattr(type, SHAPE_ATTR, None) if type.is_block() else scalar
        if record is None:  # a block type the cache did not make
            build(self, handle, type)
            return
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self.shape, self.numel = record.tensor_shape, record.tensor_numel

    tl.tensor.__init__ = init


def _same_shape_needs_no_broadcast() -> None:
    """`broadcast_impl_value(lhs, rhs)` of two blocks of equal shapes returns them unchanged, after comparing their
    shapes dimension by dimension through triton tuples (a fifth of SGLang's interpreted extend-attention
    kernel): when both types carry the same shape record, return them at once. Every other case (a scalar, a
    different rank or shape, an uncached type) goes through the original."""
    from triton.language import semantic

    broadcast = semantic.TritonSemantic.broadcast_impl_value

    def fast(self: Any, lhs: Any, rhs: Any) -> Any:
        record = getattr(lhs.type, SHAPE_ATTR, None)
        if record is not None and record is getattr(rhs.type, SHAPE_ATTR, None):
            return lhs, rhs
        return broadcast(self, lhs, rhs)

    semantic.TritonSemantic.broadcast_impl_value = fast
