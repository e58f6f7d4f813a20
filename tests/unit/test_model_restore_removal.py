"""Restore units the host no longer needs are disabled and removed by provision (after a model's
source moved to the control machine, its restore unit stayed enabled and would copy the old source at boot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.commands import Cmd
from opsctl.inventory.load import load_inventory
from opsctl.ops.base import Context
from opsctl.ops.model_restore import ModelRestore, installed_cmd, parse_installed, plan_removal
from opsctl.remote.fake import FakeHost

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
LISTED = "opsctl-model-Qwen3-8B.service\nopsctl-model-Qwen3-8B-DFlash.service\nopsctl-model-Old.service\n"


def test_plan_removal_disables_before_removing_and_stops_last() -> None:
    keep = "opsctl-model-Keep.service"
    actions, notes = plan_removal(["opsctl-model-Old.service", keep], {keep})
    shown = [a.display() for a in actions if isinstance(a, Cmd)]
    assert shown == [
        "systemctl disable --quiet -- opsctl-model-Old.service",
        "rm -f -- /etc/systemd/system/opsctl-model-Old.service",
        # the accepted manifest (trusted.json) stays: only the restore's own files go
        "rm -f -- /var/lib/opsctl/models/Old/manifest.json /var/lib/opsctl/models/Old/sha256sums",
        "systemctl daemon-reload",
        "sh -c 'systemctl stop -- opsctl-model-Old.service 2>/dev/null || true'",
    ]
    assert len(notes) == 1 and "opsctl-model-Old.service" in notes[0]
    assert plan_removal([keep], {keep}) == ([], [])


def test_parse_installed_takes_restore_units_only() -> None:
    out = "opsctl-model-A.service\nopsctl-gpu0.service\nopsctl-model-$(x).service\n\n"
    assert parse_installed(out) == ["opsctl-model-A.service"]


def test_provision_plan_removes_only_the_unit_no_service_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(GOLDEN).hosts[0]  # its services' models have host-side sources

    def handler(cmd: Cmd):
        if cmd.display() == installed_cmd().display():
            return (0, LISTED, "")
        if cmd.display().startswith("cat "):
            return (1, "", "No such file")  # no manifests yet: the wanted units are not rewritten
        return None

    plan = ModelRestore().plan(Context(host, FakeHost(host.name, handler=handler)))
    assert plan.changes
    commands = plan.commands()
    assert "sudo systemctl disable --quiet -- opsctl-model-Old.service" in commands
    assert not any("Qwen3-8B" in c and ("disable" in c or "rm " in c) for c in commands)
