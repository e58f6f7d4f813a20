"""The runtime decides its configuration once, at the edge: only configuration modules and a process's start read
the environment (`os.environ`, `os.getenv`); nothing on a round's path does (the tree planner's switch is
`DDTreeConfig.fused_build`, read once per process by `ddtree.config.process_config`)."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"

# module -> why it may read the environment
EDGES = {
    "ddtree/config.py": "the DDTREE_* configuration, read once per process",
    "ddtree/serve/args.py": "the reference server's arguments",
    "ddtree/serve/__main__.py": "the reference server's start",
    "ddtree/serve/faults.py": "the lab's fault injection, armed once when the worker starts",
    "ddtree/sglang/plugin.py": "SGLang's argument validation and worker factory (per process)",
    "ddtree/sglang/prom_glue.py": "the metrics sink of an SGLang process, chosen once",
}


def environment_reads(path: Path) -> list[int]:
    """Lines of `os.environ`, `os.getenv` and `from os import environ/getenv` in the file."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in ("environ", "getenv") for alias in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_only_configuration_modules_and_process_edges_read_the_environment() -> None:
    files = sorted((RUNTIME / "ddtree").rglob("*.py"))
    assert len(files) > 30
    readers = {str(p.relative_to(RUNTIME)): environment_reads(p) for p in files}
    assert readers["ddtree/config.py"], "the guard sees no read at all: is it looking?"
    assert not readers["ddtree/fused_tree.py"]  # the planner switch is a config field now
    assert not readers["ddtree/serve/state.py"]  # the lab's loading hold comes through the server's arguments
    stray = {name: lines for name, lines in readers.items() if lines and name not in EDGES}
    assert stray == {}, f"read the environment in ddtree.config (or at a process's start), not here: {stray}"
