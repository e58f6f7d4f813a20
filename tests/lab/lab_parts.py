"""Which lab a lab-tier pytest uses, and which of the tier's modules it runs (OPSCTL_LAB_SLOT, OPSCTL_LAB_PART).

scripts/check runs the lab tier as three pytests at once, OPSCTL_LAB_PART=1, =2 and =3: each selects its modules
(parts 2 and 3: OWN_LABS' modules; part 1: every other module, so a new module lands there) and brings up a lab of
its own, so no two share hosts, an inventory file, a network namespace, a bridge, a subnet or a state dir:

| part | lab | inventory | subnet | names (prefix) | dirs |
| --- | --- | --- | --- | --- | --- |
| unset (whole tier) | default, or slot N's | inventory/lab.yaml | 10.213 (slot: 10.22N) | olab (olabN) | lab (lab-N) |
| 1 | the same as unset | inventory/lab[-N]-p1.yaml | as unset | as unset | as unset |
| 2 | its own | inventory/lab[-N]-p2.yaml | 10.20N | olab[N]p2 | lab[-N]-p2 |
| 3 | its own | inventory/lab[-N]-p3.yaml | 10.23N | olab[N]p3 | lab[-N]-p3 |

Part 1 keeps the default lab, so `opsctl lab status` (test_lab's CLI test) still sees it. The lab tests' other
fixed names stay in part 1: test_lab's second labs (olabt, olabk, 10.214, 10.215, 10.218) and test_pip_index's
namespace (10.24N); the other parts' modules only name hosts through their lab's inventory.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path

from opsctl.lab import LabConfig
from opsctl.lab.config import slot_config

REPO = Path(__file__).resolve().parents[2]
# The parts with a lab of their own: their modules, and the second octet of their subnets (10.<base + slot>).
# The router's deploys and canaries (part 2) and the journey's and bench's deploys were one part, the run's long
# pole (1337 s of 1357 s, docs/ci.md); split, part 1 (1150 s) would be the longest, so test_remote's quick SSH
# checks join the journey in part 3 (the fault deploys, 345 s alone at load 1-2, would outweigh it). Last there,
# as in part 1: its final test reboots lab2. With one OpenMP thread per server part 1 ended ~450 s
# after part 3 in a warm run, alone on the machine for its last ~100 s: test_provision (its own venv and models,
# ~150 s) moved to part 3. Why: docs/ci.md, "How scripts/check runs the tiers".
OWN_LABS: dict[str, tuple[frozenset[str], int]] = {
    "2": (frozenset({"test_router.py"}), 200),
    "3": (frozenset({"test_journey.py", "test_lab_bench.py", "test_provision.py", "test_remote.py"}), 230),
}
PARTS = ("1", *OWN_LABS)


class LabEnvError(ValueError):
    pass


def slot() -> str:
    value = os.environ.get("OPSCTL_LAB_SLOT", "")
    if value and value not in {str(n) for n in range(1, 10)}:
        raise LabEnvError(f"OPSCTL_LAB_SLOT must be one digit 1-9, got {value[:20]!r}")
    return value


def part() -> str:
    value = os.environ.get("OPSCTL_LAB_PART", "")
    if value not in {"", *PARTS}:
        raise LabEnvError(f"OPSCTL_LAB_PART must be one of {', '.join(PARTS)}, got {value[:20]!r}")
    return value


def part_of(module: str) -> str:
    """The part that runs the lab module named `module` (a file name such as test_router.py)."""
    return next((p for p, (modules, _) in OWN_LABS.items() if module in modules), "1")


def in_part(module: str) -> bool:
    """Whether this pytest runs the lab module named `module`."""
    which = part()
    return not which or part_of(module) == which


def inventory_path() -> Path:
    """The inventory file this pytest's lab writes (and the deploy tests derive theirs from)."""
    which, n = part(), slot()
    if not which:
        return REPO / "inventory" / "lab.yaml"
    return REPO / "inventory" / f"lab{f'-{n}' if n else ''}-p{which}.yaml"


def lab_config() -> LabConfig:
    n = slot()
    config = slot_config(n, LabConfig(inventory_path=inventory_path()))  # the slot's lab, as `opsctl lab` sees it
    which = part()
    if which in OWN_LABS:
        base = OWN_LABS[which][1]
        config = dataclasses.replace(
            config,
            subnet=ipaddress.IPv4Network(f"10.{base + int(n or 0)}.0.0/24"),
            root_dir=config.root_dir.with_name(f"{config.root_dir.name}-p{which}"),
            state_dir=config.state_dir.with_name(f"{config.state_dir.name}-p{which}"),
            prefix=f"{config.prefix}p{which}",
        )
    return config
