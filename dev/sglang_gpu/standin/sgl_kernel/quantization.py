"""`sgl_kernel.quantization`: imported at module level by `srt/layers/quantization/gguf.py:49` (GGUF ops), never
called for unquantized models. Every name is an op that raises NotImplementedError."""

from ._missing import module_getattr

__getattr__ = module_getattr(__name__)
