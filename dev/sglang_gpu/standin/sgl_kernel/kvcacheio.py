"""`sgl_kernel.kvcacheio`: imported at module level by `srt/mem_cache/memory_pool_host.py:45` and
`srt/mem_cache/pool_host/*.py` (host KV-cache transfers, hierarchical cache only, which the harness leaves off).
Every name is an op that raises NotImplementedError."""

from ._missing import module_getattr

__getattr__ = module_getattr(__name__)
