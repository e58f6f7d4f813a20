"""opsctl: take bare GPU hosts over SSH to running, verified SGLang speculative-decoding services."""

__version__ = "0.1.0"
