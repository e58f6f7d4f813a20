"""ddtree.fused_tree: the Triton top-k, best-first expansion, layout and FULL_MASK kernels give exactly
what the torch paths give (`build_trees_batched` / `build_tree_heap`, `layout_batch`, `full_mask_batched`), ties,
-inf, budget = block - 1, wide trees, top-k 1 and budget 0 included. On a CPU they run under Triton's interpreter
(`TRITON_INTERPRET=1`, which triton reads when the kernels are defined), so the checks run in a subprocess; on a
CUDA host the same script runs compiled (runtime/bench/round_bench.py checks the H200 at full vocabulary too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import os, sys, torch
if os.environ.get("TRITON_INTERPRET") == "1":
    import triton_interpreter  # tests/runtime: cheaper device-function calls in the interpreter
    triton_interpreter.install()
from dataclasses import fields
from ddtree.batch_tree import build_trees_batched
from ddtree.config import FusedBuild
from ddtree.fused_tree import build_trees_fused, fused_available, row_topk_fused
from ddtree.batch_tree import batch_row_topk
from ddtree.sglang import batch_round as br
from ddtree.tree import build_tree_heap
from tree_inputs import batch_logprobs  # tests/runtime: the parity tests' one generator

device = torch.device(sys.argv[1])
assert fused_available(device, 8, FusedBuild.ON), "fused build unavailable"
problems = []


def logprobs(kind, bs, rows, vocab, seed):  # neg_inf: rows with fewer finite tokens than the top-k
    return batch_logprobs(seed, bs, rows, vocab, [kind], masked=0.985).to(device)


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())


cases = [  # kind, bs, vocab, budget, topk, slots
    ("continuous", 3, 5000, 15, 8, 16),
    ("quantized", 2, 300, 15, 8, 16),
    ("quantized", 2, 300, 31, 8, 32),
    ("uniform", 2, 300, 15, 8, 16),
    ("neg_inf", 3, 300, 15, 8, 16),
    ("bf16", 2, 300, 15, 8, 16),
    ("continuous", 2, 300, 7, 3, 8),
    ("continuous", 2, 300, 15, 1, 16),
    ("quantized", 2, 300, 1, 8, 16),
    ("continuous", 1, 300, 0, 8, 16),
]
for i, (kind, bs, vocab, budget, topk, slots) in enumerate(cases):
    lp = logprobs(kind, bs, slots // 2 if slots > 16 else slots - 1, vocab, i)
    roots = torch.arange(bs, device=device) + 5
    prefix = (torch.arange(bs) * 37 + 3).to(device)
    torch_trees = build_trees_batched(lp, roots, budget, topk)
    trees = build_trees_fused(lp, roots, budget, topk)
    for name in ("tokens", "parents", "depths", "scores"):
        if not same(getattr(trees, name), getattr(torch_trees, name)):
            problems.append(f"case {i} trees.{name}")
    for b in range(bs):
        heap = build_tree_heap(lp[b], int(roots[b]), budget, topk)
        if not all(same(getattr(heap, n), getattr(trees.tree(b), n)) for n in ("tokens", "parents", "depths")):
            problems.append(f"case {i} request {b}: differs from build_tree_heap")
    want = br.layout_batch(torch_trees, prefix, slots)
    got = br.layout_batch_fused(trees, prefix, slots)
    for f in fields(want):
        if f.name != "trees" and not same(getattr(want, f.name), getattr(got, f.name)):
            problems.append(f"case {i} layout.{f.name}")
    numel = br.full_mask_numel(int(prefix.sum()), bs, slots)
    mask_torch = br.full_mask_batched(want.tree_mask, prefix, numel, FusedBuild.OFF)
    if not same(br.full_mask_batched(got.tree_mask, prefix, numel, FusedBuild.ON), mask_torch):
        problems.append(f"case {i} full_mask")
    if budget and topk <= vocab:
        rows = lp.shape[1]
        v1, i1 = row_topk_fused(lp, rows, topk)
        v2, i2 = batch_row_topk(lp.reshape(bs * rows, vocab), topk)
        if not (same(v1.reshape(-1, topk), v2) and same(i1.reshape(-1, topk), i2)):
            problems.append(f"case {i} row_topk")
print("\n".join(problems) or "PASS")
"""


def run_script(device: str, interpret: bool) -> str:
    path = [str(REPO / "runtime"), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    if interpret:
        env.update(TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, device], env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_fused_equals_torch_paths_interpreted() -> None:
    pytest.importorskip("triton")
    assert run_script("cpu", interpret=True) == "PASS"


def test_fused_equals_torch_paths_cuda() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert run_script("cuda", interpret=False) == "PASS"
