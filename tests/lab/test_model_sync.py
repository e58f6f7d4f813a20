"""model_sync against a lab host's real /dev/shm (tmpfs) over real SSH and rsync: a tmpfs that fills up during the
copy is one line with the bytes needed and free, and the partial copy goes.

No venv, no service: the model_sync step runs on its own against lab1 (provision's other steps are in
test_provision.py). The copy is slowed (rsync --bwlimit through a PATH wrapper, as test_provision does) so that a
filler written on the host once the first bytes landed takes the rest of the space while rsync still writes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shlex
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.commands import Cmd
from opsctl.errors import ShmTooSmallError
from opsctl.inventory.load import load_inventory
from opsctl.ops.base import Artifacts, Context
from opsctl.ops.model_sync import ModelPaths, ModelSync
from opsctl.provision import control_manifest
from opsctl.remote import SshHost, connect
from tests.lab.deploy_support import add_service, derived_inventory, only_hosts

FILES = 3
FILE_BYTES = 8 << 20


@pytest.fixture
def slowed_rsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`rsync` on PATH capped at 2 MiB/s for copies into a staging dir; it notes (the returned file) when one began."""
    real = shutil.which("rsync")
    assert real is not None
    started = tmp_path / "copy-started"
    folder = tmp_path / "bin"
    folder.mkdir()
    wrapper = folder / "rsync"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *.opsctl-sync-*) : > {shlex.quote(str(started))}; '
        f'exec {shlex.quote(real)} --bwlimit=2048 "$@";; esac\n'
        f'exec {shlex.quote(real)} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return started


@pytest.fixture
def lab1(lab_inventory: object) -> Iterator[SshHost]:
    from tests.lab.deploy_support import LAB_INVENTORY

    remote = connect(load_inventory(LAB_INVENTORY).host("lab1"))
    try:
        yield remote
    finally:
        remote.close()


def _fill_once_copying(lab1: SshHost, staging: str, started: Path, filler: str) -> threading.Thread:
    """Once rsync wrote its first bytes into `staging`, a file that takes nearly all the rest of /dev/shm."""

    def fill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if started.exists():
                du = lab1.run(Cmd.of("sh", "-c", f"du -sb {shlex.quote(staging)} 2>/dev/null"), check=False)
                if du.stdout.strip() and int(du.stdout.split()[0]) > 65536:
                    break
            time.sleep(0.05)
        # all but 4 MiB: rsync goes on writing while this starts (2 MiB/s), and has more than 4 MiB still to write
        free = "$(df -P -B1 /dev/shm | awk 'NR == 2 {print $4}')"
        lab1.run(Cmd.of("sh", "-c", f"fallocate -l $(({free} - 4194304)) {shlex.quote(filler)}"), check=False)

    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    return thread


def test_shm_filling_during_the_copy_is_one_line_and_the_partial_copy_goes(
    lab1: SshHost, slowed_rsync: Path, tmp_path: Path
) -> None:
    name = f"msync-{secrets.token_hex(3)}"
    source = tmp_path / "model"
    source.mkdir()
    for i in range(FILES):
        (source / f"part-{i}.safetensors").write_bytes(os.urandom(FILE_BYTES))
    dest = f"/dev/shm/{name}"

    def mutate(doc: dict[str, object]) -> None:
        only_hosts(doc, ["lab1"])  # type: ignore[arg-type]
        svc = add_service(doc, "lab1", name, 30091)  # type: ignore[arg-type]
        svc["model"] = {"source": str(source), "source_on": "control", "path": dest}
        svc.pop("draft_model", None)
        svc["mode"] = "baseline"

    host = load_inventory(derived_inventory(tmp_path / "inv.yaml", mutate)).host("lab1")
    host = dataclasses.replace(host, services=tuple(s for s in host.services if s.name == name))
    staging, filler = ModelPaths.of(dest).staging, f"/dev/shm/{name}-filler"
    progress: list[str] = []
    manifests = {str(source): control_manifest(source)}
    ctx = Context(host, lab1, artifacts=Artifacts(manifests=manifests), progress=progress.append)
    try:
        op = ModelSync()
        plan = op.plan(ctx)
        filling = _fill_once_copying(lab1, staging, slowed_rsync, filler)
        with pytest.raises(ShmTooSmallError) as info:
            op.apply(ctx, plan)
        filling.join(timeout=60)
    finally:
        lab1.run(Cmd.of("rm", "-rf", "--", filler, dest, staging), check=False)
    line = info.value.one_line()
    need = f"{FILES * FILE_BYTES / (1 << 20):.1f} MiB"
    assert re.match(rf"^/dev/shm on lab1 is full: {re.escape(need)} needed, [\d.]+ (KiB|MiB) free \(the copy of ", line)
    assert "No space left on device" in line and "exited 11" not in line and "rsync -a" not in line, line
    assert f"; the partial copy was removed ({staging})" in line and "\n" not in line, line
    assert any("MiB/s" in p or "kB/s" in p for p in progress), progress  # the streamed copy reported its bytes
    gone = lab1.run(Cmd.of("sh", "-c", f"ls -d {shlex.quote(staging)} {shlex.quote(dest)} 2>&1"), check=False)
    assert gone.exit_code != 0 and "No such file" in gone.stdout, gone.stdout
