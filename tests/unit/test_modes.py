"""One table of modes, kept twice: opsctl's (`opsctl.modes`) and the runtime's (`ddtree.modes`; hosts install the
runtime without opsctl). The two are equal row for row, every row is coherent, and what opsctl renders for a
service of each mode is read back by the runtime as that same mode."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest

from opsctl import modes
from opsctl.inventory.load import load_inventory
from opsctl.render import render_service
from tests.unit.test_render import GOLDEN, SECRET


def runtime_modes() -> ModuleType:
    """ddtree.modes (pure Python, no torch), imported where a test needs it, as the unit tier does the runtime."""
    from ddtree import modes as table

    return table


def test_opsctl_and_the_runtime_have_the_same_table() -> None:
    runtime = runtime_modes()
    assert [(m.name, m.value) for m in modes.Mode] == [(m.name, m.value) for m in runtime.Mode]
    assert [f.name for f in dataclasses.fields(modes.ModeSpec)] == [
        f.name for f in dataclasses.fields(runtime.ModeSpec)
    ]
    for mode in modes.Mode:
        ours, theirs = modes.MODES[mode], runtime.MODES[runtime.Mode(mode.value)]
        assert dataclasses.asdict(ours) == dataclasses.asdict(theirs), mode


@pytest.mark.parametrize("mode", list(modes.Mode))
def test_every_row_is_coherent(mode: modes.Mode) -> None:
    spec = mode.spec
    assert (spec.algorithm != "") == spec.drafts  # a drafter runs through SGLang's speculative algorithm
    assert not spec.builds_tree or spec.drafts  # trees are drafted
    assert not spec.verifies_tree or spec.builds_tree
    assert not spec.eager_draft_head or spec.builds_tree  # only DDTree reads the draft distributions
    assert mode.speculative == spec.drafts and mode.ddtree == spec.builds_tree
    sharing = [m for m in modes.Mode if m.spec.algorithm == spec.algorithm]
    assert len(sharing) == 1 or spec.builds_tree  # several rows share an algorithm only where DDTREE_VERIFY tells


def test_the_runtime_config_takes_exactly_the_modes_that_build_trees() -> None:
    from ddtree.config import DDTreeConfig

    for mode in runtime_modes().Mode:
        if mode.spec.builds_tree:
            assert DDTreeConfig.from_env({"DDTREE_VERIFY": mode.value}).verify is mode
        else:
            with pytest.raises(ValueError, match=f"DDTREE_VERIFY='{mode.value}': expected one of shadow, tree"):
                DDTreeConfig.from_env({"DDTREE_VERIFY": mode.value})


@pytest.mark.parametrize("engine", ["sgl", "ref"])
def test_what_opsctl_renders_the_runtime_reads_back_as_the_same_mode(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", SECRET)
    host = load_inventory(GOLDEN / "inventory.yaml").hosts[0]
    for mode in modes.Mode:
        rendered = render_service(host, host.service(f"{engine}-{mode.value}"), "r")
        flags = list(rendered.flags)
        algorithm = flags[flags.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in flags else ""
        env = dict(line.split("=", 1) for line in rendered.env.splitlines() if "=" in line and line[0] != "#")
        assert algorithm == mode.spec.algorithm
        assert ("DDTREE_VERIFY" in env) == mode.spec.builds_tree
        assert runtime_modes().mode_of(algorithm, env.get("DDTREE_VERIFY")).value == mode.value
