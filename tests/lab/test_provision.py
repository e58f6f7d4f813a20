"""`opsctl provision` against real lab hosts (no GPU, no internet): the CLI end to end.

The test writes its own inventory from the lab's (its own venv path and /dev/shm model paths, small random
"models"), so it never disturbs what other lab tests deploy on the same hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.commands import Cmd
from opsctl.errors import OpsctlError
from opsctl.inventory.load import load_inventory
from opsctl.lab import LabReport
from opsctl.remote import SshHost, connect
from opsctl.wheel import remote_wheel_path

pytestmark = pytest.mark.lab

VENV = "/opt/opsctl/venv-provtest"
TARGET = "/dev/shm/provtest-target"
DRAFT = "/dev/shm/provtest-draft"
OPSCTL = (sys.executable, "-c", "from opsctl.cli.app import main; main()")


def _write_model(root: Path, files: dict[str, int], seed: int) -> Path:
    rng = random.Random(seed)
    for name, size in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == "config.json":
            path.write_bytes(b'{"model_type": "qwen3"}')
            continue
        with path.open("wb") as fh:
            for start in range(0, size, 16 << 20):
                fh.write(rng.randbytes(min(16 << 20, size - start)))
    return root


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, Path]]:
    base = Path(os.environ.get("OPSCTL_TEST_TMP", "/var/tmp")) / f"opsctl-provtest-{os.getpid()}"
    target = _write_model(
        base / "target", {"config.json": 0, "model.safetensors": 120 << 20, "tokenizer.json": 1 << 20}, 1
    )
    draft = _write_model(base / "draft", {"config.json": 0, "model.safetensors": 4 << 20}, 2)
    yield {"target": target, "draft": draft}
    subprocess.run(["rm", "-rf", str(base)], check=False)


@dataclass(frozen=True)
class Pinned:
    """This module's own runtime wheel, locks and wheelhouse. Concurrent work may change runtime/, locks/ and the
    shared wheelhouse while this module runs; each is a legitimate change that a second provision would
    (rightly) act on, so the module pins its own copies."""

    wheel: Path
    locks: Path
    wheelhouse: Path


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> Pinned:
    from opsctl import wheelhouse
    from opsctl.artifact import runtime_wheel
    from opsctl.kernel.locks import Lock, Profile, locks_dir

    root = tmp_path_factory.mktemp("pinned")
    locks = root / "locks"
    shutil.copytree(locks_dir(), locks)
    lock = Lock(Profile.REFERENCE, "reference-cpu.txt", (locks / "reference-cpu.txt").read_text())
    built = wheelhouse.ensure(lock, wheelhouse.CACHE_DIR)
    copy = root / "wheelhouse"
    if subprocess.run(["cp", "-al", str(built.path), str(copy)], check=False).returncode != 0:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(built.path, copy)
    wheel = root / runtime_wheel().name
    shutil.copyfile(runtime_wheel().path, wheel)
    return Pinned(wheel, locks, copy)


@pytest.fixture(scope="module")
def inventory(lab_hosts: LabReport, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    doc = yaml.safe_load(Path(lab_hosts.inventory).read_text())
    doc["defaults"]["venv"] = VENV
    for host in doc["hosts"].values():
        for svc in host["services"].values():
            svc["model"] = {"source": str(models["target"]), "source_on": "control", "path": TARGET}
            svc["draft_model"] = {"source": str(models["draft"]), "source_on": "control", "path": DRAFT}
    path = tmp_path_factory.mktemp("provision") / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def hosts(inventory: Path, pinned: Pinned) -> Iterator[dict[str, SshHost]]:
    inv = load_inventory(inventory)
    remotes = {h.name: connect(h) for h in inv.hosts}
    for remote in remotes.values():  # start from bare hosts (for this test's paths)
        remote.run(Cmd.of("sh", "-c", f"rm -rf {VENV} /dev/shm/provtest-* /dev/shm/.opsctl-*-provtest-*"))
        remote.run(Cmd.of("rm", "-rf", posixpath.dirname(wheel_path(pinned))))
    try:
        yield remotes
    finally:
        for remote in remotes.values():
            try:
                remote.run(Cmd.of("sh", "-c", f"rm -rf {VENV} /dev/shm/provtest-* /dev/shm/.opsctl-*-provtest-*"))
            except OpsctlError:
                pass  # the lab is shared: another test may have stopped this host
            remote.close()


@dataclass(frozen=True)
class Provision:
    """`opsctl provision -i INVENTORY --runtime-wheel WHEEL --json ...` as a subprocess."""

    inventory: Path
    pinned: Pinned

    def argv(self, *args: str) -> list[str]:
        p = self.pinned
        return [*OPSCTL, "provision", "-i", str(self.inventory), "--runtime-wheel", str(p.wheel),
                "--wheelhouse", str(p.wheelhouse), *args]  # fmt: skip

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "OPSCTL_LOCKS_DIR": str(self.pinned.locks)}

    def __call__(self, *args: str, timeout: float = 1500) -> tuple[int, dict[str, Any], str]:
        proc = subprocess.run(
            self.argv("--json", *args), capture_output=True, text=True, timeout=timeout, check=False, env=self.env
        )
        body = json.loads(proc.stdout) if proc.stdout.strip() else {}
        return proc.returncode, body, proc.stderr


@pytest.fixture(scope="module")
def opsctl(inventory: Path, pinned: Pinned) -> Provision:
    return Provision(inventory, pinned)


def wheel_path(pinned: Pinned) -> str:
    return remote_wheel_path(pinned.wheel.name, hashlib.sha256(pinned.wheel.read_bytes()).hexdigest())


def snapshot(remote: SshHost) -> str:
    """What this module's provision could touch on a host (the lab is shared: other tests' paths are left out):
    file listing with sizes and mtimes, dpkg and pip state."""
    script = (
        f"find {VENV} /dev/shm /opt/opsctl/wheels -path '*provtest*' -printf '%p %s %T@\\n' 2>/dev/null | sort; "
        f"dpkg -l | md5sum; {VENV}/bin/pip freeze 2>&1 | md5sum"
    )
    return remote.run(Cmd.of("sh", "-c", script)).stdout


def steps(body: dict[str, Any], host: str) -> dict[str, dict[str, Any]]:
    entry = next(h for h in body["hosts"] if h["host"] == host)
    return {s["op"]: s for s in entry["steps"]}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def remote_sha(remote: SshHost, path: str) -> str:
    return remote.run(Cmd.of("sha256sum", path)).stdout.split()[0]


def test_plan_changes_nothing(opsctl: Provision, hosts: dict[str, SshHost]) -> None:
    before = {name: snapshot(r) for name, r in hosts.items()}
    code, body, stderr = opsctl("--plan")
    assert code == 2, stderr
    after = {name: snapshot(r) for name, r in hosts.items()}
    assert after == before
    for remote in hosts.values():
        assert remote.run(Cmd.of("test", "-e", wheel_path(opsctl.pinned)), check=False).exit_code == 1
    for name in hosts:
        s = steps(body, name)
        assert s["gpu_driver"]["status"] == "unchanged"
        assert s["gpu_driver"]["notes"] == ["no NVIDIA GPU detected"]
        assert s["python_venv"]["status"] == "pending"
        assert (
            f"sudo {VENV}/bin/pip install --no-compile --no-index --find-links /var/cache/opsctl/wheelhouse "
            f"-r {VENV}/opsctl-lock.txt" in s["python_venv"]["commands"]
        )
        assert s["model_sync"]["status"] == "pending"
    assert "no NVIDIA GPU detected" in stderr


def test_provision_then_second_run_reports_zero_changes(
    opsctl: Provision, hosts: dict[str, SshHost], models: dict[str, Path]
) -> None:
    start = time.monotonic()
    code, body, stderr = opsctl()
    first = time.monotonic() - start
    assert code == 0, stderr
    assert {h["status"] for h in body["hosts"]} == {"changed"}
    for remote in hosts.values():
        out = remote.run(
            Cmd.of(f"{VENV}/bin/python", "-c", "import torch, transformers, fastapi; print(torch.__version__)")
        )
        assert out.stdout.strip() == "2.13.0+cpu"
        assert remote_sha(remote, f"{TARGET}/model.safetensors") == sha(models["target"] / "model.safetensors")
        assert remote_sha(remote, f"{DRAFT}/model.safetensors") == sha(models["draft"] / "model.safetensors")
        manifest = json.loads(remote.run(Cmd.of("cat", f"{TARGET}/.opsctl-manifest.json")).stdout)
        assert manifest["files"]["tokenizer.json"]["size"] == 1 << 20
    start = time.monotonic()
    code, body, stderr = opsctl()
    second = time.monotonic() - start
    assert code == 0, stderr
    changed = {h["host"]: [s for s in h["steps"] if s["status"] != "unchanged"] for h in body["hosts"]}
    assert [(h["host"], h["status"], h["changes"]) for h in body["hosts"]] == [
        (name, "unchanged", 0) for name in sorted(hosts)
    ], changed
    code, body, _ = opsctl("--plan")
    assert code == 0
    print(f"\nprovision: first run {first:.1f}s, second run {second:.1f}s (0 changes)")


def test_require_gpu_fails_on_a_cpu_host(opsctl: Provision, hosts: dict[str, SshHost]) -> None:
    code, body, _ = opsctl("--require-gpu", "--host", "lab1")
    assert code == 1
    step = steps(body, "lab1")["gpu_driver"]
    assert step["status"] == "failed"
    assert step["error"] == "no NVIDIA GPU detected (the inventory expects 0)"
    assert steps(body, "lab1")["python_venv"]["status"] == "skipped"


def test_corrupted_model_file_is_detected_and_recopied(
    opsctl: Provision, hosts: dict[str, SshHost], models: dict[str, Path]
) -> None:
    lab1 = hosts["lab1"]
    weights = f"{TARGET}/model.safetensors"
    # flip bytes in place, keep size and mtime: only the manifest can tell
    lab1.run(
        Cmd.of(
            "sh", "-c",
            f"touch -r {weights} /tmp/ref && printf 'XXXX' | dd of={weights} bs=1 seek=4096 conv=notrunc "
            f"status=none && touch -r /tmp/ref {weights}",
        )
    )  # fmt: skip
    assert remote_sha(lab1, weights) != sha(models["target"] / "model.safetensors")
    code, body, stderr = opsctl("--host", "lab1")
    assert code == 0, stderr
    step = steps(body, "lab1")["model_sync"]
    assert step["status"] == "changed"
    assert "1 corrupted or changed (model.safetensors)" in step["notes"][0]
    assert remote_sha(lab1, weights) == sha(models["target"] / "model.safetensors")
    code, body, _ = opsctl("--host", "lab1")
    assert (code, body["hosts"][0]["changes"]) == (0, 0)


def _slowed_model_copy(folder: Path, started: Path) -> str:
    """A PATH whose first `rsync` notes that the model's copy into its staging dir began (the file `started`) and
    caps that copy at 1 MiB/s, so the 120 MiB model takes about two minutes however fast or loaded the machine is;
    every other rsync runs unchanged. (The test polled `ps` for the copy instead: under load the copy finished
    between two polls, and the test failed.)"""
    real = shutil.which("rsync")
    assert real is not None
    folder.mkdir()
    wrapper = folder / "rsync"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *.opsctl-sync-provtest-target*) : > {shlex.quote(str(started))}; '
        f'exec {shlex.quote(real)} --bwlimit=1024 "$@";; esac\n'
        f'exec {shlex.quote(real)} "$@"\n'
    )
    wrapper.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def _staged_bytes(remote: SshHost) -> int:
    done = remote.run(Cmd.of("sh", "-c", "du -sb /dev/shm/.opsctl-sync-provtest-target 2>/dev/null"), check=False)
    return int(done.stdout.split()[0]) if done.stdout.strip() else 0


def test_interrupted_copy_leaves_no_partial_model(opsctl: Provision, hosts: dict[str, SshHost], tmp_path: Path) -> None:
    lab1 = hosts["lab1"]
    lab1.run(Cmd.of("rm", "-rf", TARGET))
    started = tmp_path / "copy-started"
    proc = subprocess.Popen(
        opsctl.argv("--host", "lab1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**opsctl.env, "PATH": _slowed_model_copy(tmp_path / "bin", started)},
    )
    # Ctrl-C (to the whole process group, as a terminal does) once the model's copy has begun and written bytes
    # into the staging dir: a partial model exists there when the interrupt comes
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if started.exists() and _staged_bytes(lab1) > 0:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "provision finished before the copy could be interrupted"
    assert started.exists(), "the model copy never started"
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    assert lab1.run(Cmd.of("test", "-e", TARGET), check=False).exit_code == 1  # no partial model
    code, body, stderr = opsctl("--host", "lab1")
    assert code == 0, stderr
    assert steps(body, "lab1")["model_sync"]["status"] == "changed"
    assert lab1.run(Cmd.of("sh", "-c", "ls -d /dev/shm/.opsctl-*-provtest-* 2>/dev/null"), check=False).stdout == ""


def test_too_small_shm_is_refused_with_the_sizes(opsctl: Provision, hosts: dict[str, SshHost]) -> None:
    lab2 = hosts["lab2"]
    lab2.run(Cmd.of("rm", "-rf", TARGET))
    free = int(lab2.run(Cmd.of("df", "-P", "-B1", "/dev/shm")).stdout.splitlines()[-1].split()[3])
    lab2.run(Cmd.of("fallocate", "-l", str(free - (8 << 20)), "/dev/shm/provtest-filler"))
    try:
        code, body, _ = opsctl("--host", "lab2")
    finally:
        lab2.run(Cmd.of("rm", "-f", "/dev/shm/provtest-filler"))
    assert code == 1
    step = steps(body, "lab2")["model_sync"]
    assert step["status"] == "failed"
    assert re.match(r"/dev/shm on lab2 is full: \d+\.\d MiB needed, \d\.\d MiB free \(provtest-target: ", step["error"])
    assert "nothing was copied" in step["error"], step["error"]  # about 8 MiB free
    assert lab2.run(Cmd.of("test", "-e", TARGET), check=False).exit_code == 1


@pytest.mark.skipif(os.environ.get("OPSCTL_BENCH") != "1", reason="benchmark: set OPSCTL_BENCH=1 (needs ~5 GiB RAM)")
def test_model_sync_benchmark_2gib(hosts: dict[str, SshHost], inventory: Path) -> None:
    """model_sync of a 2 GiB model vs a plain `rsync -a` of the same files to the same host (docs/provision.md)."""
    from opsctl.inventory.model import DDTreeKnobs, Engine, Mode, ModelSourceKind, ModelSpec, Service
    from opsctl.ops.base import Artifacts, Context
    from opsctl.ops.model_sync import ModelSync
    from opsctl.provision import control_manifest

    lab1 = hosts["lab1"]
    spec_host = load_inventory(inventory).host("lab1")
    source = Path("/var/tmp/opsctl-bench-model")
    subprocess.run(["rm", "-rf", str(source)], check=True)
    _write_model(source, {"config.json": 0, **{f"model-{i:05d}-of-00004.safetensors": 512 << 20 for i in range(4)}}, 3)
    cache = Path("/var/cache/opsctl/manifests")
    lab1.run(Cmd.of("mount", "-o", "remount,size=3G", "/dev/shm"))
    dest, plain = "/dev/shm/bench-model", "/dev/shm/bench-plain"
    try:
        lab1.run(Cmd.of("rm", "-rf", dest, plain))
        subprocess.run(["sh", "-c", f"rm -f {cache}/*.json"], check=False)
        t0 = time.monotonic()
        lab1.sync_dir(source, plain)
        t_plain = time.monotonic() - t0
        lab1.run(Cmd.of("rm", "-rf", plain))

        model = ModelSpec(str(source), ModelSourceKind.CONTROL, dest, hybrid=False)
        svc = Service("b", "lab1", (), 30000, Mode.BASELINE, Engine.REFERENCE, model, None, DDTreeKnobs())
        host = replace(spec_host, services=(svc,))
        t0 = time.monotonic()
        manifest = control_manifest(source)  # cold: hashes 2 GiB on the control machine
        t_hash = time.monotonic() - t0
        ctx = Context(host, lab1, artifacts=Artifacts(manifests={str(source): manifest}))
        t0 = time.monotonic()
        plan = ModelSync().plan(ctx)
        ModelSync().apply(ctx, plan)
        t_sync = time.monotonic() - t0
        t0 = time.monotonic()
        again = Context(host, lab1, artifacts=Artifacts(manifests={str(source): control_manifest(source)}))
        assert ModelSync().plan(again).actions == ()
        t_noop = time.monotonic() - t0
        cold = t_hash + t_sync
        print(
            f"\nmodel_sync 2 GiB: plain rsync -a {t_plain:.1f}s; model_sync cold {cold:.1f}s "
            f"(control hash {t_hash:.1f}s + plan/stage/verify/rename {t_sync:.1f}s) = {cold / t_plain:.2f}x; "
            f"warm manifest cache {t_sync:.1f}s = {t_sync / t_plain:.2f}x; no-op re-check {t_noop:.1f}s"
        )
        assert remote_sha(lab1, f"{dest}/model-00000-of-00004.safetensors") == sha(
            source / "model-00000-of-00004.safetensors"
        )
    finally:
        lab1.run(Cmd.of("rm", "-rf", dest, plain))
        lab1.run(Cmd.of("mount", "-o", "remount,size=2G", "/dev/shm"))
        subprocess.run(["rm", "-rf", str(source)], check=False)
