"""`deploy --plan` reads secrets as the deploy does: an unset API key variable is the same one-line refusal,
not a plan that says "unchanged" while the real deploy exits 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.deploy.flow import DeploySettings
from opsctl.errors import DeployError
from opsctl.inventory.load import load_inventory
from opsctl.remote.fake import FakeHost
from opsctl.rollout import runner
from opsctl.rollout.runner import RolloutOptions
from opsctl.wheel import RuntimeWheel

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"


def _refusal(plan: bool, tmp_path: Path) -> str:
    inv = load_inventory(GOLDEN)
    host = inv.hosts[0]
    touched: list[str] = []

    def connect(h):  # a fake that records being asked
        touched.append(h.name)
        return FakeHost(h.name)

    wheel = RuntimeWheel(tmp_path / "w.whl", "f" * 64)
    with pytest.raises(DeployError) as err:
        runner.deploy(
            [(host, [host.service("ref-shadow")])], wheel, DeploySettings(plan=plan), RolloutOptions(),
            say=lambda _m: None, connect=connect,
        )  # fmt: skip
    assert touched == []  # refused before any host is touched
    return err.value.one_line()


def test_plan_refuses_an_unset_api_key_like_the_deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPSCTL_GOLDEN_KEY", raising=False)
    planned, deployed = _refusal(True, tmp_path), _refusal(False, tmp_path)
    assert planned == deployed
    assert "OPSCTL_GOLDEN_KEY" in planned and "nothing was deployed" in planned and "\n" not in planned
