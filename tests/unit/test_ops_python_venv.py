"""python_venv: lock selection, exact plans (wheelhouse and online), marker idempotence, the import check."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from opsctl.errors import AbiMismatchError, FactError, ProvisionError
from opsctl.inventory.model import (
    DDTreeKnobs,
    Engine,
    Host,
    Mode,
    ModelSourceKind,
    ModelSpec,
    Service,
    SshConfig,
)
from opsctl.kernel.locks import Lock, Profile, lock_for, locks_dir
from opsctl.ops.base import Artifacts, Context, Verify
from opsctl.ops.python_venv import (
    VERIFY_SCRIPT,
    PythonVenv,
    VenvCheck,
    VenvFacts,
    VenvSpec,
    judge_check,
    marker_json,
    parse_verify,
    plan_venv,
)
from opsctl.remote.fake import FakeHost

ROOT = Path(__file__).resolve().parents[2]
FACTS = ROOT / "tests" / "fixtures" / "facts"
VENV = "/opt/opsctl/venv"


def service(engine: Engine) -> Service:
    model = ModelSpec("/models/t", ModelSourceKind.CONTROL, "/dev/shm/t", hybrid=False)
    return Service("ref", "h", (), 30000, Mode.BASELINE, engine, model, None, DDTreeKnobs())


def host(engine: Engine = Engine.REFERENCE, gpus: int = 0, wheelhouse: str | None = None) -> Host:
    return Host("h", "10.0.0.1", SshConfig(), gpus, VENV, "python3", "0.5.23", None, wheelhouse, (service(engine),))


def ref_spec(wheelhouse: Path | None = None, files: tuple[str, ...] = ()) -> VenvSpec:
    return VenvSpec(VENV, "python3", lock_for(host()), 0, wheelhouse, files)


def test_lock_selection_by_engine() -> None:
    assert lock_for(host(Engine.REFERENCE)).name == "reference-cpu.txt"
    sglang = lock_for(host(Engine.SGLANG))
    assert sglang.profile is Profile.SGLANG
    assert sglang.name == "sglang-0.5.23.txt"
    assert "sglang==0.5.23" in sglang.requirements()
    assert "torch==2.14.1" in sglang.requirements()


def test_missing_lock_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match=r"no requirement lock .*sglang-0\.5\.23\.txt"):
        lock_for(host(Engine.SGLANG), tmp_path)


def test_reference_lock_covers_the_runtime_dependencies() -> None:
    project = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["server"]}
    locked = {_name(r) for r in lock_for(host()).requirements()}
    assert wanted <= locked, wanted - locked
    assert "torch==2.13.0" in lock_for(host()).requirements()  # the CPU torch the team pins


def _name(requirement: str) -> str:
    for sep in ("==", ">=", "<=", "[", "<", ">", ";", " "):
        requirement = requirement.split(sep, 1)[0]
    return requirement.strip().lower()


def test_fresh_host_plan_with_wheelhouse(tmp_path: Path) -> None:
    spec = ref_spec(tmp_path, ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",))
    plan = plan_venv(spec, VenvFacts((3, 11, 2), None, None))
    assert plan.commands() == [
        f"sudo python3 -m venv {VENV}",
        "sudo mkdir -p /var/cache/opsctl/wheelhouse",
        f"push {tmp_path} -> /var/cache/opsctl/wheelhouse",
        f"write {VENV}/opsctl-lock.txt ({len(spec.lock.text.encode())} bytes, mode 644)",
        f"sudo {VENV}/bin/pip install --no-compile --no-index --find-links /var/cache/opsctl/wheelhouse "
        f"-r {VENV}/opsctl-lock.txt",
        f"verify import torch, transformers, safetensors, fastapi, uvicorn: {VENV}/bin/python -c VERIFY_SCRIPT "
        "torch transformers safetensors fastapi uvicorn",
        f"write {VENV}/.opsctl-venv.json ({len(marker_json(spec).encode())} bytes, mode 644)",
    ]


def test_online_sglang_plan_installs_from_the_lock() -> None:
    lock = lock_for(host(Engine.SGLANG))
    spec = VenvSpec(VENV, "python3", lock, 8)
    plan = plan_venv(spec, VenvFacts((3, 12, 3), (3, 12, 3), "stale"))
    assert plan.commands()[:2] == [
        f"write {VENV}/opsctl-lock.txt ({len(lock.text.encode())} bytes, mode 644)",
        f"sudo {VENV}/bin/pip install --no-compile -r {VENV}/opsctl-lock.txt",
    ]
    assert plan.commands()[2].endswith("torch sgl_kernel flashinfer sglang")
    verify = plan.actions[2]
    assert isinstance(verify, Verify) and verify.cmd.argv[2] == VERIFY_SCRIPT  # the real script runs
    assert plan.notes == (f"venv {VENV} does not match sglang-0.5.23.txt",)


def test_matching_marker_is_a_no_op() -> None:
    spec = ref_spec(Path("/wh"), ("a.whl", "b.whl"))
    plan = plan_venv(spec, VenvFacts((3, 11, 2), (3, 11, 2), spec.marker_hash))
    assert plan.actions == ()
    assert plan.notes == (f"venv {VENV} (Python 3.11.2) matches reference-cpu.txt",)


def test_marker_changes_with_lock_or_wheelhouse() -> None:
    base = ref_spec(Path("/wh"), ("a.whl",))
    assert ref_spec(Path("/wh"), ("a.whl", "b.whl")).marker_hash != base.marker_hash
    changed = Lock(Profile.REFERENCE, "x", base.lock.text + "rich\n")
    other = VenvSpec(VENV, "python3", changed, 0, Path("/wh"), ("a.whl",))
    assert other.marker_hash != base.marker_hash


def test_python_too_old_is_refused() -> None:
    with pytest.raises(ProvisionError, match=re.escape("Python 3.10.12; SGLang needs >= 3.11")):
        plan_venv(ref_spec(), VenvFacts((3, 10, 12), None, None))
    with pytest.raises(ProvisionError, match=re.escape("has Python 3.10.12")):
        plan_venv(ref_spec(), VenvFacts((3, 11, 2), (3, 10, 12), None))
    with pytest.raises(ProvisionError, match="not found"):
        plan_venv(ref_spec(), VenvFacts(None, None, None))


def test_abi_mismatch_is_reported_with_the_fix() -> None:
    check = parse_verify(0, (FACTS / "venv-check-abi-mismatch.txt").read_text(), "")
    spec = VenvSpec(VENV, "python3", lock_for(host(Engine.SGLANG)), 8)
    with pytest.raises(AbiMismatchError) as info:
        judge_check(check, spec)
    assert "sgl_kernel was built against another torch ABI (torch 2.14.1+cu130)" in info.value.message
    assert info.value.hint is not None
    assert "pip install --force-reinstall -r /opt/opsctl/venv/opsctl-lock.txt" in info.value.hint
    assert "never upgrade torch alone" in info.value.hint


def test_undefined_symbol_in_a_crash_is_an_abi_mismatch() -> None:
    stderr = "ImportError: /x/common_ops.abi3.so: undefined symbol: _ZN3c10\n"
    spec = VenvSpec(VENV, "python3", lock_for(host(Engine.SGLANG)), 8)
    with pytest.raises(AbiMismatchError):
        judge_check(parse_verify(1, "", stderr), spec)


def test_sglang_checks_cuda_devices_and_capability() -> None:
    ok = parse_verify(0, (FACTS / "venv-check-sglang-ok.txt").read_text(), "")
    spec = VenvSpec(VENV, "python3", lock_for(host(Engine.SGLANG)), 8)
    judge_check(ok, spec)  # passes: 8 devices, sm_120 in the arch list
    assert ok.capability == (12, 0)
    with pytest.raises(ProvisionError, match="is_available\\(\\) is False"):
        judge_check(VenvCheck(ok.versions, {}, cuda=False), spec)
    with pytest.raises(ProvisionError, match="no kernels for sm_120"):
        judge_check(VenvCheck(ok.versions, {}, True, 8, (12, 0), ("sm_80", "sm_90")), spec)
    with pytest.raises(ProvisionError, match="sees 4 GPUs"):
        judge_check(VenvCheck(ok.versions, {}, True, 4, (12, 0), ("sm_120",)), spec)


def test_reference_profile_does_not_need_cuda() -> None:
    check = VenvCheck({"torch": "2.13.0+cpu"}, {}, cuda=False)
    judge_check(check, ref_spec())
    with pytest.raises(ProvisionError, match="import fastapi failed"):
        judge_check(VenvCheck({}, {"fastapi": "ModuleNotFoundError: No module named 'fastapi'"}), ref_spec())


def test_malformed_verify_output() -> None:
    with pytest.raises(FactError, match="no result"):
        parse_verify(1, "", "Segmentation fault\n")
    with pytest.raises(FactError, match="malformed"):
        parse_verify(0, '{"versions": 3}\n', "")


def test_verify_script_runs_here() -> None:
    # the script is real Python: run it on the control machine with cheap modules
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", VERIFY_SCRIPT, "json", "no_such_module_xyz"], capture_output=True, text=True
    )
    body = json.loads(out.stdout)
    assert body["versions"] == {"json": "2.0.9"}
    assert body["errors"]["no_such_module_xyz"].startswith("ModuleNotFoundError")


def test_op_reads_facts_and_plans_no_op_from_marker(tmp_path: Path) -> None:
    (tmp_path / "a.whl").write_text("x")
    ctx_host = host(wheelhouse=str(tmp_path))
    artifacts = Artifacts(wheelhouses={"reference": tmp_path})
    spec = VenvSpec(VENV, "python3", lock_for(ctx_host), 0, tmp_path, ("a.whl",))
    remote = FakeHost(
        "h",
        answers={
            "python3 --version": (0, "Python 3.11.2\n", ""),
            f"{VENV}/bin/python --version": (0, "Python 3.11.2\n", ""),
            f"cat {VENV}/.opsctl-venv.json": (0, marker_json(spec), ""),
        },
        default=None,
    )
    plan = PythonVenv().plan(Context(ctx_host, remote, artifacts=artifacts))
    assert plan.actions == ()
    assert locks_dir() == ROOT / "locks"
