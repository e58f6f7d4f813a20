"""Credential files with group/other access: an `api_key: file:` secret or an SSH key at 0644 or
0666 is refused when the inventory loads, with the chmod to run; SSH keys as OpenSSH judges them (only the
user's own); `credential_files: warn` turns each refusal into a warning."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from opsctl.errors import InventoryError
from opsctl.inventory import credfiles
from opsctl.inventory.load import parse_inventory
from tests.conftest import run_cli
from tests.unit.test_router_inventory import BASE


def secret(tmp_path: Path, mode: int, name: str = "key") -> Path:
    path = tmp_path / name
    path.write_text("hunter2-credfile-secret\n")
    os.chmod(path, mode)
    return path


def with_key(path: Path, where: str = "service", **top: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if where != "router":
        del data["routers"]  # a router would need the services' key too
    if where == "service":
        data["hosts"]["h1"]["services"]["a"]["api_key"] = f"file:{path}"
    elif where == "router":
        data["routers"]["front"]["api_key"] = f"file:{path}"
    else:
        data["hosts"]["h2"]["ssh"] = {"key_file": str(path)}
    data.update(top)
    return data


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604])
def test_a_secret_file_others_can_read_is_refused_with_the_chmod(tmp_path: Path, mode: int) -> None:
    path = secret(tmp_path, mode)
    with pytest.raises(InventoryError) as info:
        parse_inventory(with_key(path))
    line = info.value.one_line()
    assert line == (
        f"hosts.h1.services.a.api_key: a secret file, {path} is mode {mode:04o}: its group or other users can "
        f"access it (chmod 600 {path})"
    )
    assert "hunter2" not in line


def test_router_keys_ssh_keys_and_private_files(tmp_path: Path) -> None:
    assert parse_inventory(with_key(secret(tmp_path, 0o600))).hosts[0].services[0].api_key is not None
    assert parse_inventory(with_key(secret(tmp_path, 0o400, "ro"))).warnings == ()
    with pytest.raises(InventoryError) as info:
        parse_inventory(with_key(secret(tmp_path, 0o644, "r"), "router"))
    assert info.value.path == "routers.front.api_key"
    with pytest.raises(InventoryError) as info:
        parse_inventory(with_key(secret(tmp_path, 0o644, "id_ed25519"), "ssh"))
    assert info.value.one_line().startswith("hosts.h2.ssh.key_file: an SSH private key, ")
    assert "(OpenSSH refuses such a key)" in info.value.one_line()
    # a file that is not there is left to the command that reads it
    assert parse_inventory(with_key(tmp_path / "absent")).warnings == ()


def test_ssh_keys_are_judged_as_openssh_does() -> None:
    assert credfiles.loose_mode(0o100644, 1000, 1000, ssh_key=True)
    assert not credfiles.loose_mode(0o100644, 0, 1000, ssh_key=True)  # another user's key: OpenSSH lets it be
    assert credfiles.loose_mode(0o100644, 0, 1000, ssh_key=False)  # a secret file: any owner
    assert not credfiles.loose_mode(0o100600, 1000, 1000, ssh_key=True)
    assert credfiles.loose_mode(0o100610, 1000, 1000, ssh_key=False)  # group execute is access too


def test_the_inventory_may_opt_in_to_warnings(tmp_path: Path) -> None:
    key, ssh = secret(tmp_path, 0o644), secret(tmp_path, 0o666, "id")
    data = with_key(key, credential_files="warn")
    data["hosts"]["h2"]["ssh"] = {"key_file": str(ssh)}
    data["hosts"]["h2"]["services"]["a"]["api_key"] = f"file:{key}"  # the same file twice: one warning
    warnings = parse_inventory(data).warnings
    assert warnings == (
        f"hosts.h1.services.a.api_key: a secret file, {key} is mode 0644: its group or other users can access it: "
        f"chmod 600 {key}",
        f"hosts.h2.ssh.key_file: an SSH private key, {ssh} is mode 0666: its group or other users can access it "
        f"(OpenSSH refuses such a key): chmod 600 {ssh}",
    )
    with pytest.raises(InventoryError) as info:
        parse_inventory(with_key(key, credential_files="ignore"))
    assert info.value.one_line() == "credential_files: expected one of refuse, warn, got 'ignore'"


def test_the_cli_says_it_in_one_line(tmp_path: Path) -> None:
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(with_key(secret(tmp_path, 0o644))))
    result = run_cli("render", "-i", str(file))
    assert result.exit_code == 1
    assert f"chmod 600 {tmp_path / 'key'}" in result.stderr and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_deploy_prints_each_inventory_warning_once(tmp_path: Path) -> None:
    """`opsctl deploy` once loaded the inventory twice and printed each warning twice."""
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(with_key(secret(tmp_path, 0o644), credential_files="warn")))
    result = run_cli("deploy", "-i", str(file), "--service", "nosuch")  # refused after the load: nothing connects
    assert result.exit_code == 1
    assert result.stderr.count("WARNING:") == 1 and result.stderr.count("chmod 600") == 1, result.stderr
