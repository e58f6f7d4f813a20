"""ddtree: DDTree speculative decoding runtime (tree build, exact tree verify, SGLang plugin, reference engine)."""

__version__ = "0.1.0"
