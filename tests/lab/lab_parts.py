"""Which lab a lab-tier pytest uses, and which of the tier's modules it runs (OPSCTL_LAB_SLOT, OPSCTL_LAB_PART).

scripts/check runs the lab tier as two pytests at once, OPSCTL_LAB_PART=1 and =2: each selects its modules
(part 2: PART_2; part 1: every other module, so a new module lands there) and brings up a lab of its own, so
the two never share hosts, an inventory file, a network namespace, a bridge, a subnet or a state dir:

| part | lab | inventory | subnet | names (prefix) | dirs |
| --- | --- | --- | --- | --- | --- |
| unset (whole tier) | default, or slot N's | inventory/lab.yaml | 10.213 (slot: 10.22N) | olab (olabN) | lab (lab-N) |
| 1 | the same as unset | inventory/lab[-N]-p1.yaml | as unset | as unset | as unset |
| 2 | its own | inventory/lab[-N]-p2.yaml | 10.20N | olab[N]p2 | lab[-N]-p2 |

Part 1 keeps the default lab, so `opsctl lab status` (test_lab's CLI test) still sees it. The lab tests' other
fixed names stay in part 1: test_lab's second labs (olabt, olabk, 10.214, 10.215, 10.218) and test_pip_index's
namespace (10.24N); part 2's modules only name hosts through their lab's inventory.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path

from opsctl.lab import LabConfig

REPO = Path(__file__).resolve().parents[2]
# The part-2 modules: the long deploys (router, journey, bench), about half of the tier's time; test_provision
# stays in part 1, which part 2 otherwise outlasts.
PART_2 = frozenset({"test_journey.py", "test_lab_bench.py", "test_router.py"})


class LabEnvError(ValueError):
    pass


def slot() -> str:
    value = os.environ.get("OPSCTL_LAB_SLOT", "")
    if value and value not in {str(n) for n in range(1, 10)}:
        raise LabEnvError(f"OPSCTL_LAB_SLOT must be one digit 1-9, got {value[:20]!r}")
    return value


def part() -> str:
    value = os.environ.get("OPSCTL_LAB_PART", "")
    if value not in {"", "1", "2"}:
        raise LabEnvError(f"OPSCTL_LAB_PART must be 1 or 2, got {value[:20]!r}")
    return value


def in_part(module: str) -> bool:
    """Whether this pytest runs the lab module named `module` (a file name such as test_router.py)."""
    which = part()
    return not which or (module in PART_2) == (which == "2")


def inventory_path() -> Path:
    """The inventory file this pytest's lab writes (and the deploy tests derive theirs from)."""
    which, n = part(), slot()
    if not which:
        return REPO / "inventory" / "lab.yaml"
    return REPO / "inventory" / f"lab{f'-{n}' if n else ''}-p{which}.yaml"


def lab_config() -> LabConfig:
    n = slot()
    config = LabConfig(inventory_path=inventory_path())
    if n:
        config = dataclasses.replace(
            config,
            subnet=ipaddress.IPv4Network(f"10.{220 + int(n)}.0.0/24"),
            root_dir=config.root_dir.with_name(f"lab-{n}"),
            state_dir=config.state_dir.with_name(f"opsctl-lab-{n}"),
            prefix=f"olab{n}",
        )
    if part() == "2":
        config = dataclasses.replace(
            config,
            subnet=ipaddress.IPv4Network(f"10.{200 + int(n or 0)}.0.0/24"),
            root_dir=config.root_dir.with_name(f"{config.root_dir.name}-p2"),
            state_dir=config.state_dir.with_name(f"{config.state_dir.name}-p2"),
            prefix=f"{config.prefix}p2",
        )
    return config
