"""OpenAI-compatible HTTP server on the reference engine, with SGLang's flags, endpoints and log lines.

Run it as ``python -m ddtree.serve`` or ``ddtree-serve``; see docs/server.md.
"""
