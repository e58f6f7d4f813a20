"""opsctl stands in floors: a package or top-level module imports only from floors below its own, so units of
one floor are siblings that never import each other (provision's `ops` and `deploy`). The ground floor is the
exception: its pieces (the errors, the inventory, SSH, systemd, the kernel) import each other, kept from
circles by test_import_circles. Every import counts, those inside functions and under `TYPE_CHECKING` included.

A new package or top-level module gets its floor here; an import that would run back up a floor is a piece in
the wrong room: move the piece down to the floor both users stand on (as the audit line, the health gate and
the package locks went to opsctl/kernel/, the model facts to opsctl/facts/)."""

from __future__ import annotations

from tests.unit.test_import_circles import import_graph

GROUND = 1
FLOORS: dict[str, int] = {
    # 1, the ground: values, the wire, and what every act shares
    "opsctl": 1,  # the package's face (__version__)
    "errors": 1,
    "yamlload": 1,
    "modes": 1,
    "promtext": 1,
    "localfiles": 1,
    "layout": 1,
    "progress": 1,
    "runtime_build": 1,
    "pip_index": 1,
    "bundle": 1,
    "chat": 1,
    "metrics": 1,
    "secrets": 1,
    "commands": 1,
    "inventory": 1,
    "remote": 1,
    "systemd": 1,
    "health": 1,
    "wheel": 1,
    "kernel": 1,  # audit, gate, locks, hashing
    # 2, reads and renders: facts of a host, the files of a release, the runtime wheel, the wheelhouse, the lab
    "facts": 2,
    "render": 2,
    "smoke": 2,
    "logs": 2,
    "artifact": 2,
    "wheelhouse": 2,
    "lab": 2,
    # 3, acts on one host: provision's operations and a service's deploy, siblings
    "ops": 3,
    "deploy": 3,
    # 4, the router as a target of its own (its release, API, membership)
    "router": 4,
    # 5, fleet orchestration: the runner across hosts, rolling and canary deploys behind a router
    "rollout": 5,
    # 6, what a command does, whole
    "provision": 6,
    "status": 6,
    "bench": 6,
    "monitor": 6,
    # 7, the command line
    "cli": 7,
}


def unit(module: str) -> str:
    """The floor table's name of an opsctl module: its top-level package or module under opsctl."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """`a -> b (floor x -> y)` for every import of a module from one on its own floor or higher (the ground
    floor's own pieces excepted)."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = floors[unit(module)], floors[unit(target)]
            if unit(module) == unit(target) or there < here or here == there == GROUND:
                continue
            found.append(f"{module} -> {target} (floor {here} -> {there})")
    return found


def opsctl_graph() -> dict[str, set[str]]:
    return {
        module: {t for t in targets if t.split(".")[0] == "opsctl"}
        for module, targets in import_graph().items()
        if module.split(".")[0] == "opsctl"
    }


def test_every_opsctl_unit_has_a_floor() -> None:
    units = {unit(module) for module in opsctl_graph()}
    assert {"kernel", "facts", "ops", "deploy", "router", "rollout", "cli"} <= units
    assert units == set(FLOORS), "give each new package or module a floor in FLOORS"


def test_no_import_runs_back_up_a_floor() -> None:
    graph = opsctl_graph()
    assert sum(len(t) for t in graph.values()) > 500  # the guard sees the imports
    assert upward(graph, FLOORS) == []


def test_the_guard_sees_an_upward_and_a_sibling_import() -> None:
    floors = {"opsctl": 1, "errors": 1, "kernel": 1, "ops": 3, "deploy": 3, "rollout": 5}
    graph = {
        "opsctl.kernel.audit": {"opsctl.errors"},  # ground to ground: allowed
        "opsctl.ops.base": {"opsctl.kernel.audit", "opsctl.ops.plan"},  # down, and inside its own unit
        "opsctl.deploy.flow": {"opsctl.ops.base"},  # a sibling
        "opsctl.kernel.gate": {"opsctl.rollout.runner"},  # back up
    }
    assert upward(graph, floors) == [
        "opsctl.deploy.flow -> opsctl.ops.base (floor 3 -> 3)",
        "opsctl.kernel.gate -> opsctl.rollout.runner (floor 1 -> 5)",
    ]


def test_the_guard_reads_imports_inside_functions() -> None:
    graph = opsctl_graph()
    # router/keptout.py imports opsctl.remote's connect inside a function only
    assert "opsctl.remote" in graph["opsctl.router.keptout"]
