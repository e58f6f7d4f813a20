"""No two modules of opsctl/ or runtime/ddtree import each other. A pair that does is a type in the wrong room:
move the type to the module that owns it (as `ServiceContext` went to opsctl/deploy/context.py, `Endpoint` beside
the inventory's SshConfig, `RuntimeWheel` to opsctl/wheel.py, `RoundStats` to ddtree/stats.py). Every import counts,
those under `TYPE_CHECKING` and inside functions included: the read order of the code has the circle either way.

And no class is built inside a function there, and none is longer than LARGEST_CLASS lines (a class that grows
past it is doing the work of collaborators: the SGLang tree worker composes its round, verifier, self-check and
hooks). A class that must subclass one known only at run time (SGLang's) lives in a module that imports it at
module level, loaded when it is needed (`ddtree.sglang.shadow_worker`, `ddtree.sglang.spec_algo`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ((ROOT / "opsctl", ROOT), (ROOT / "runtime" / "ddtree", ROOT / "runtime"))
LARGEST_CLASS = 400
# Circles waiting on a change in a file being rewritten elsewhere, each with the move that breaks it.
KNOWN: set[tuple[str, str]] = set()


def _module(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(module: str, path: Path) -> set[str]:
    """Every name an import statement of the file reaches, relative imports resolved."""
    names: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    files = {_module(p, base): p for pkg, base in PACKAGES for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        for name in _imported(module, path):
            parts = name.split(".")
            known = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files), None)
            if known and known != module:
                targets.add(known)
        graph[module] = targets
    return graph


def two_file_circles(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Pairs that import each other; a package and its own submodule are not a circle."""
    return {
        (min(a, b), max(a, b))
        for a, targets in graph.items()
        for b in targets
        if a in graph.get(b, set()) and not (a.startswith(b + ".") or b.startswith(a + "."))
    }


def test_no_two_modules_import_each_other() -> None:
    graph = import_graph()
    assert len(graph) > 150 and "opsctl.deploy.flow" in graph and "ddtree.tree" in graph
    assert two_file_circles(graph) - KNOWN == set()


def test_the_guard_sees_a_circle_under_type_checking() -> None:
    graph = {"a.flow": {"a.guards", "a"}, "a.guards": {"a.flow"}, "a": {"a.flow"}, "a.other": set()}
    assert two_file_circles(graph) == {("a.flow", "a.guards")}
    graph = import_graph()
    assert "opsctl.deploy.context" in graph["opsctl.deploy.guards"]  # a TYPE_CHECKING import, counted
    assert "opsctl.deploy.flow" not in graph["opsctl.deploy.guards"]


def classes_in_functions(source: str) -> list[str]:
    """`function.Class` for every class statement inside a function body (nested functions included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.extend(f"{node.name}.{inner.name}" for inner in ast.walk(node) if isinstance(inner, ast.ClassDef))
    return found


def test_no_class_is_built_inside_a_function() -> None:
    files = [p for pkg, _ in PACKAGES for p in pkg.rglob("*.py")]
    assert len(files) > 150
    built = {str(p.relative_to(ROOT)): classes_in_functions(p.read_text()) for p in files}
    assert {path: names for path, names in built.items() if names} == {}


def test_the_class_guard_sees_a_class_in_a_function() -> None:
    source = "class Top:\n    def m(self):\n        def f():\n            class Inner: ...\n"
    source += "\ndef g():\n    class Local: ...\n"
    assert sorted(set(classes_in_functions(source))) == ["f.Inner", "g.Local", "m.Inner"]


def test_no_class_is_longer_than_the_limit() -> None:
    sizes = {}
    for pkg, _ in PACKAGES:
        for path in pkg.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    sizes[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert sizes["runtime/ddtree/sglang/tree_worker.py:DDTreeTreeWorker"] > 100  # the guard sees the classes
    assert {name: n for name, n in sizes.items() if n > LARGEST_CLASS} == {}
