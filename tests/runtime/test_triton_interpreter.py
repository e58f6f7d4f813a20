"""tests/runtime/triton_interpreter.py: under TRITON_INTERPRET=1 (in a subprocess: triton reads it when kernels
are defined), a kernel whose loop calls a device function computes the same values with the patch, and
`triton.language` is patched once per launch instead of once per device call, and a later launch replays the
first one's patches (restored after it like any launch's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
SCRIPT = r"""
import sys
import torch, triton, triton.language as tl
import triton.runtime.interpreter as interp
import triton_interpreter

@triton.jit
def step(x, i):
    return tl.where(x > i, x * 0.5, x + tl.sigmoid(x))

@triton.jit
def kernel(x_ptr, out_ptr, N: tl.constexpr, STEPS: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    for i in range(STEPS):
        x = step(x, i)
    tl.store(out_ptr + offs, x)

from triton.language import semantic

casts = []  # Triton-level casts built per launch: the overflow check of every integer + - * makes some
cast = semantic.TritonSemantic.cast
def counting_cast(self, *args, **kwargs):
    casts.append(1)
    return cast(self, *args, **kwargs)
semantic.TritonSemantic.cast = counting_cast
# the broadcasts of two blocks of one shape that reach triton's own broadcast_impl_value (the patch answers them)
broadcasts = []
broadcast = semantic.TritonSemantic.broadcast_impl_value
def counting_broadcast(self, lhs, rhs):
    if lhs.type.is_block() and rhs.type.is_block() and list(lhs.type.shape) == list(rhs.type.shape):
        broadcasts.append(1)
    return broadcast(self, lhs, rhs)
semantic.TritonSemantic.broadcast_impl_value = counting_broadcast
slow_tensor = tl.tensor.__init__
slow_np_dtype = interp._get_np_dtype
slow_block_type = tl.block_type.__init__

calls = []
original = interp._patch_lang
def counting(fn):
    calls.append(fn.__name__)
    return original(fn)
interp._patch_lang = counting

def run():
    x = torch.linspace(-3, 9, 64)
    out = torch.empty_like(x)
    kernel[(4,)](x, out, N=16, STEPS=6)
    return out

plain = run()
plain_casts, plain_broadcasts = len(casts), len(broadcasts)
before = len(calls)
assert triton_interpreter.install() and triton_interpreter.install()  # idempotent
fast = run()
fast_casts = len(casts) - plain_casts
fast_broadcasts = len(broadcasts) - plain_broadcasts
after = len(calls) - before
assert torch.equal(plain, fast), (plain - fast).abs().max()
where, tensor_add = tl.where, tl.tensor.__add__
again = run()  # a second launch: the same patches replayed (no getmembers), then restored as before
assert torch.equal(plain, again), (plain - again).abs().max()
assert tl.where is where and tl.tensor.__add__ is tensor_add  # every patch undone after the launch
print(before, after, len(calls) - before - after)
dtypes = [tl.float32, tl.float16, tl.bfloat16, tl.int1, tl.int32, tl.uint8, tl.int64, tl.pointer_type(tl.float32),
          tl.block_type(tl.float16, [4]), tl.block_type(tl.int32, [2, 8]), tl.block_type(tl.pointer_type(tl.int8), [2])]
for dt in dtypes * 2:  # the second pass answers from the cache
    assert interp._get_np_dtype(dt) == slow_np_dtype(dt), dt
shapes = [(tl.float32, [4, 8]), (tl.int32, tl.tuple([16])), (tl.float16, [tl.constexpr(2), 4]),
          (tl.pointer_type(tl.int8), [8])]
for element, shape in shapes * 2:  # the second pass answers from the cache (not the pointer's: unhashable)
    made, want = tl.block_type(element, shape), object.__new__(tl.block_type)
    slow_block_type(want, element, shape)
    assert made == want and (made.shape, made.numel, made.name) == (want.shape, want.numel, want.name), shape
# refused as before, however often asked; a builtin tuple too (`tuple` in triton's isinstance is its own)
for bad in ([3], [], [0, 4], (4, 8)) * 2:
    try:
        tl.block_type(tl.float32, bad)
    except (AssertionError, TypeError, ValueError):
        pass
    else:
        raise AssertionError(f"block_type accepted {bad}")
# a tensor's shape, numel, dtype and type: the original's values (shared per shape now), for blocks and scalars
for ty in [tl.block_type(tl.float32, [4, 8]), tl.block_type(tl.int32, [4, 8]), tl.block_type(tl.int1, [16]),
           tl.block_type(tl.pointer_type(tl.int8), [2]), tl.float32, tl.int64]:
    made, want = tl.tensor("h", ty), object.__new__(tl.tensor)
    slow_tensor(want, "h", ty)
    assert type(made.shape) is type(want.shape) and [d.value for d in made.shape] == [d.value for d in want.shape]
    assert type(made.numel) is type(want.numel) and made.numel.value == want.numel.value, ty
    assert (made.handle, made.type, made.dtype) == (want.handle, want.type, want.dtype), ty
print(plain_casts, fast_casts)
print(plain_broadcasts, fast_broadcasts)
"""


def test_device_calls_skip_repatching_and_compute_the_same() -> None:
    pytest.importorskip("triton")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    launches, checks, broadcasts = done.stdout.splitlines()
    before, after, replayed = map(int, launches.split())
    plain_casts, fast_casts = map(int, checks.split())
    assert before == 1 + 4 * 6 * 2  # the launch, then each device call (step, and tl.sigmoid in it) x 4 x 6
    # the launch, and tl.sigmoid's first call (its module sees triton.language.core, which the kernel's does not)
    assert after == 2
    assert replayed == 1  # a later launch replays its patches: only tl.sigmoid's module is patched the slow way
    # integer + and * (the index math `program_id * N + arange` among them) were checked for int32 overflow, two
    # casts to int64 each, the result thrown away without `debug`: no longer built; the values above are the same
    assert plain_casts - fast_casts >= 4 * 2 * 2, (plain_casts, fast_casts)
    # two blocks of one shape (`x > i` after its splat, `x + sigmoid(x)`, ...) are returned as they are, without
    # triton's dimension-by-dimension comparison; the values above are the same
    plain_broadcasts, fast_broadcasts = map(int, broadcasts.split())
    assert plain_broadcasts > 0 and fast_broadcasts == 0, (plain_broadcasts, fast_broadcasts)
