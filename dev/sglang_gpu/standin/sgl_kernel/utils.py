"""`sgl_kernel.utils`: what `srt/layers/attention/triton_backend.py:71,340` imports."""

from __future__ import annotations


def is_arch_support_pdl() -> bool:
    """Whether kernels may be launched with programmatic dependent launch (sgl_kernel: True on SM90+). False here:
    the Triton attention backend then launches its kernels plainly (`use_pdl=False`), always correct; PDL only
    overlaps a kernel's prologue with its predecessor's tail."""
    return False
