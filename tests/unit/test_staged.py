"""StagedRelease: rendered once, bound to its id, the same files as rendering at that id directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.deploy import release
from opsctl.deploy.staged import StagedRelease
from opsctl.inventory.load import load_inventory
from opsctl.render import Secrets, render_service
from opsctl.secrets import SecretError

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
RID = "20261129T223000Z-0123456789ab"


def test_bound_release_equals_a_render_at_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k3y-value-never-shown")
    for host in load_inventory(GOLDEN).hosts:
        for service in host.services:
            staged = StagedRelease.render(host, service).bind(RID)
            masked = render_service(host, service, RID, Secrets.MASK)
            revealed = render_service(host, service, RID, Secrets.REVEAL)
            assert [(f.name, f.masked, f.mode) for f in staged.files] == [
                (f.name, f.text, f.mode) for f in masked.files
            ]
            assert [f.text for f in staged.revealed()] == [f.text for f in revealed.files]
            assert staged.argv == masked.exec_start and staged.flags == masked.flags
            assert all("k3y-value-never-shown" not in f.masked for f in staged.files)


def test_hash_ignores_the_id_and_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    host = load_inventory(GOLDEN).hosts[0]
    service = host.service("ref-shadow")
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "one")
    first = StagedRelease.render(host, service)
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "two")
    second = StagedRelease.render(host, service)
    assert first.config_hash("w", "") == second.config_hash("w", "") == first.bind(RID).config_hash("w", "")
    assert first.config_hash("w", "") != first.config_hash("x", "")
    assert len(first.config_hash("w", "")) == release.HASH_LEN


def test_missing_secret_is_raised_only_when_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPSCTL_GOLDEN_KEY", raising=False)
    host = load_inventory(GOLDEN).hosts[0]
    staged = StagedRelease.render(host, host.service("ref-shadow"))
    assert staged.files and staged.config_hash("w", "")  # plan and hash need no secret
    with pytest.raises(SecretError):
        staged.revealed()
