"""Which runtime-tier modules a pytest runs (OPSCTL_RUNTIME_PART): scripts/check runs the tier (less SGLang's engine
module, a tier of its own) as two pytests at once.

Why: on a fresh machine the runtime tier is the last to end. Its tests wait for the tiny models, built in the
run, and the other tiers finish meanwhile; one pytest then has one core and the other core sits idle (seen in
cold-cache runs). Two pytests use both. While every tier runs, the cores are full either way: the split costs one
more pytest start-up (a few seconds of CPU) and saves the idle tail.

Part 2 holds SECOND's modules, part 1 every other one (so a new module lands in part 1). The split is by the
modules' measured times (docs/ci.md): about half the tier each. Unset (a plain pytest, or
`bash scripts/check tests/runtime`): every module.
"""

from __future__ import annotations

import os

PARTS = ("1", "2")
# In-process reference-engine runs (lossless, sampling, the tiny models' held-out tau, the batched builders), the
# SGLang probes and the policy's engine runs: ~640 of the tier's ~1350 s in a fresh-machine run. The modules
# with an SGLang probe are in one part: their probes share one SGLang import (conftest.py, `sglang_probes`).
SECOND = frozenset(
    {
        "test_lossless.py",
        "test_tiny.py",
        "test_sampling.py",
        "test_batch_tree.py",
        "test_sglang_plugin.py",
        "test_sglang_layout.py",
        "test_sglang_hybrid_graphs.py",
        "test_sglang_sampling_rules.py",
        "test_policy_engine.py",
        "test_drafter.py",
        "test_sglang_policy_glue.py",
        "test_sglang_batch_round.py",
        "test_hybrid.py",
    }
)


class RuntimePartError(ValueError):
    pass


def part() -> str:
    value = os.environ.get("OPSCTL_RUNTIME_PART", "")
    if value not in {"", *PARTS}:
        raise RuntimePartError(f"OPSCTL_RUNTIME_PART must be 1 or 2, got {value[:20]!r}")
    return value


def in_part(module: str) -> bool:
    """Whether this pytest runs the runtime module named `module` (a file name such as test_lossless.py)."""
    which = part()
    return not which or ("2" if module in SECOND else "1") == which
