"""DDTREE for SGLang 0.5.23 as a plugin (entry point `sglang.srt.plugins: ddtree`).

`layout` is pure torch; `plugin` and `worker` import sglang only inside functions, so `import ddtree.sglang`
works on hosts without SGLang. See docs/sglang.md.
"""
