"""python_venv: a Python >= 3.11 venv at host.venv with the packages of the host's lock, verified by import.

Offline hosts (and every lab host) install from a pushed wheelhouse with `pip install --no-index
--find-links`. A marker in the venv records the lock's hash (and the wheelhouse's file list), so a second run
with nothing new is a no-op. After an install, a small script imports the stack and checks CUDA; an
"undefined symbol" import error is reported as a torch ABI mismatch with the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import AbiMismatchError, FactError, ProvisionError
from opsctl.facts.system import parse_python_version
from opsctl.kernel.locks import Lock, Profile, lock_for
from opsctl.ops.base import Action, Context, Plan, Push, PutText, Verify, execute, read
from opsctl.remote.base import Connection

NAME = "python_venv"
MIN_PYTHON = (3, 11)
REMOTE_WHEELHOUSE = "/var/cache/opsctl/wheelhouse"
MARKER = ".opsctl-venv.json"
LOCK_FILE = "opsctl-lock.txt"

# Modules imported after an install, per profile.
VERIFY_MODULES: dict[Profile, tuple[str, ...]] = {
    Profile.REFERENCE: ("torch", "transformers", "safetensors", "fastapi", "uvicorn"),
    Profile.SGLANG: ("torch", "sgl_kernel", "flashinfer", "sglang"),
    Profile.ROUTER: ("sglang_router",),
}

# Run on the host by the venv's python: imports each module, reports versions and CUDA as one JSON line.
VERIFY_SCRIPT = """\
import importlib, json, sys
out = {"versions": {}, "errors": {}}
for name in sys.argv[1:]:
    try:
        mod = importlib.import_module(name)
        out["versions"][name] = str(getattr(mod, "__version__", "?"))
    except BaseException as exc:
        out["errors"][name] = f"{type(exc).__name__}: {exc}"
if "torch" in out["versions"]:
    import torch
    out["cuda"] = bool(torch.cuda.is_available())
    out["devices"] = torch.cuda.device_count() if out["cuda"] else 0
    out["capability"] = list(torch.cuda.get_device_capability(0)) if out["cuda"] else None
    out["arch_list"] = list(torch.cuda.get_arch_list()) if out["cuda"] else []
print(json.dumps(out))
"""


@dataclass(frozen=True)
class VenvCheck:
    versions: dict[str, str]
    errors: dict[str, str]
    cuda: bool = False
    devices: int = 0
    capability: tuple[int, int] | None = None
    arch_list: tuple[str, ...] = ()


@dataclass(frozen=True)
class VenvSpec:
    venv: str
    python: str
    lock: Lock
    expected_gpus: int
    wheelhouse: Path | None = None  # local wheel directory pushed to REMOTE_WHEELHOUSE
    wheel_files: tuple[str, ...] = field(default=())  # its file names (part of the marker hash)

    @property
    def marker_hash(self) -> str:
        digest = hashlib.sha256(self.lock.text.encode())
        for name in sorted(self.wheel_files):
            digest.update(b"\0" + name.encode())
        return digest.hexdigest()

    @property
    def bin(self) -> str:
        return f"{self.venv.rstrip('/')}/bin"


@dataclass(frozen=True)
class VenvFacts:
    host_python: tuple[int, int, int] | None
    venv_python: tuple[int, int, int] | None
    marker_hash: str | None


def marker_json(spec: VenvSpec) -> str:
    body = {"lock": spec.lock.name, "lock_sha256": spec.lock.sha256, "marker": spec.marker_hash}
    return json.dumps(body, sort_keys=True) + "\n"


def parse_marker(exit_code: int, text: str) -> str | None:
    if exit_code != 0:
        return None
    try:
        value = json.loads(text).get("marker")
    except (ValueError, AttributeError):
        return None  # a damaged marker only means "reinstall"
    return value if isinstance(value, str) else None


def install_cmd(spec: VenvSpec) -> Cmd:
    """`--no-compile`: pip would byte-compile every installed module (torch's and transformers' thousands); on
    a lab host that cost ~55-75 s of an 82-105 s install. Only what is imported gets compiled, once, by the
    import check below and the server's first start (docs/provision.md, python_venv)."""
    lock_path = f"{spec.venv.rstrip('/')}/{LOCK_FILE}"
    pip = (f"{spec.bin}/pip", "install", "--no-compile")
    if spec.wheelhouse is not None:
        return Cmd.of(*pip, "--no-index", "--find-links", REMOTE_WHEELHOUSE, "-r", lock_path, sudo=True)
    return Cmd.of(*pip, "-r", lock_path, sudo=True)


def verify_cmd(spec: VenvSpec) -> Cmd:
    return Cmd.of(f"{spec.bin}/python", "-c", VERIFY_SCRIPT, *VERIFY_MODULES[spec.lock.profile])


def plan_venv(spec: VenvSpec, facts: VenvFacts) -> Plan:
    if facts.marker_hash == spec.marker_hash and facts.venv_python is not None:
        version = ".".join(map(str, facts.venv_python))
        return Plan(NAME, notes=(f"venv {spec.venv} (Python {version}) matches {spec.lock.name}",))
    actions: list[Action] = []
    notes: list[str] = []
    if facts.venv_python is not None and facts.venv_python[:2] < MIN_PYTHON:
        raise ProvisionError(
            f"venv {spec.venv} has Python {'.'.join(map(str, facts.venv_python))} (< 3.11)",
            f"remove {spec.venv} and set python: to a 3.11+ interpreter in the inventory",
        )
    if facts.venv_python is None:
        if facts.host_python is None:
            raise ProvisionError(f"{spec.python} not found on the host", "install python3 and python3-venv")
        if facts.host_python[:2] < MIN_PYTHON:
            raise ProvisionError(
                f"{spec.python} is Python {'.'.join(map(str, facts.host_python))}; SGLang needs >= 3.11",
                "install python3.11+ and set python: in the inventory",
            )
        actions.append(Cmd.of(spec.python, "-m", "venv", spec.venv, sudo=True))
        notes.append(f"create venv {spec.venv}")
    else:
        notes.append(f"venv {spec.venv} does not match {spec.lock.name}")
    if spec.wheelhouse is not None:
        actions.append(Cmd.of("mkdir", "-p", REMOTE_WHEELHOUSE, sudo=True))
        actions.append(Push(spec.wheelhouse, REMOTE_WHEELHOUSE))
    actions.append(PutText(f"{spec.venv.rstrip('/')}/{LOCK_FILE}", spec.lock.text))
    actions.append(install_cmd(spec))
    modules = VERIFY_MODULES[spec.lock.profile]
    shown = f"{spec.bin}/python -c VERIFY_SCRIPT {' '.join(modules)}"
    actions.append(Verify(verify_cmd(spec), judge=_judge(spec), what=f"import {', '.join(modules)}", shown=shown))
    actions.append(PutText(f"{spec.venv.rstrip('/')}/{MARKER}", marker_json(spec)))
    return Plan(NAME, actions=tuple(actions), notes=tuple(notes))


def parse_verify(exit_code: int, stdout: str, stderr: str) -> VenvCheck:
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {exit_code}"
        if "undefined symbol" in stderr:
            return VenvCheck({}, {"python": tail})
        raise FactError(f"venv check printed no result: {tail}")
    try:
        body = json.loads(line)
        cap = body.get("capability")
        return VenvCheck(
            versions=dict(body["versions"]),
            errors=dict(body["errors"]),
            cuda=bool(body.get("cuda", False)),
            devices=int(body.get("devices", 0)),
            capability=(int(cap[0]), int(cap[1])) if cap else None,
            arch_list=tuple(body.get("arch_list") or ()),
        )
    except (ValueError, KeyError, TypeError, IndexError):
        raise FactError(f"venv check: malformed result {line[:200]!r}") from None


def judge_check(check: VenvCheck, spec: VenvSpec) -> None:
    """Raise when the venv is not usable for the host's profile."""
    fix = (
        f"reinstall from the lock: {spec.bin}/pip install --force-reinstall -r {spec.venv.rstrip('/')}/{LOCK_FILE}"
        " (never upgrade torch alone)"
    )
    for module, error in check.errors.items():
        if "undefined symbol" in error:
            torch = check.versions.get("torch", "?")
            raise AbiMismatchError(f"{module} was built against another torch ABI (torch {torch}): {error}", fix)
    if check.errors:
        module, error = next(iter(check.errors.items()))
        raise ProvisionError(f"import {module} failed: {error}", fix)
    if spec.lock.profile is Profile.SGLANG:
        if not check.cuda:
            raise ProvisionError(
                f"torch {check.versions.get('torch', '?')}: torch.cuda.is_available() is False",
                "check the driver (nvidia-smi) and that the lock's torch is a CUDA build",
            )
        if spec.expected_gpus and check.devices < spec.expected_gpus:
            raise ProvisionError(f"torch sees {check.devices} GPUs, the inventory expects {spec.expected_gpus}")
        if check.capability is not None and check.arch_list:
            sm = f"sm_{check.capability[0]}{check.capability[1]}"
            if sm not in check.arch_list:
                raise ProvisionError(
                    f"torch {check.versions.get('torch', '?')} has no kernels for {sm} (built for "
                    f"{', '.join(check.arch_list)})",
                    "use a torch build for this GPU in the lock (CUDA 13 wheels for Blackwell)",
                )


def _judge(spec: VenvSpec) -> Callable[[int, str, str], None]:
    def judge(exit_code: int, stdout: str, stderr: str) -> None:
        judge_check(parse_verify(exit_code, stdout, stderr), spec)

    return judge


def read_facts(remote: Connection, spec: VenvSpec) -> VenvFacts:
    host_py = read(remote, Cmd.of(spec.python, "--version"))
    venv_py = read(remote, Cmd.of(f"{spec.bin}/python", "--version"))
    marker = read(remote, Cmd.of("cat", f"{spec.venv.rstrip('/')}/{MARKER}"))
    return VenvFacts(
        parse_python_version(host_py.exit_code, host_py.stdout + host_py.stderr),
        parse_python_version(venv_py.exit_code, venv_py.stdout + venv_py.stderr),
        parse_marker(marker.exit_code, marker.stdout),
    )


def spec_for(ctx: Context) -> VenvSpec:
    lock = lock_for(ctx.spec)
    wheelhouse = ctx.artifacts.wheelhouses.get(lock.profile)
    files = tuple(sorted(p.name for p in wheelhouse.iterdir() if p.is_file())) if wheelhouse else ()
    return VenvSpec(ctx.spec.venv, ctx.spec.python, lock, ctx.spec.gpu_count, wheelhouse, files)


class PythonVenv:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        spec = spec_for(ctx)
        return plan_venv(spec, read_facts(ctx.remote, spec))

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions, timeout=3600.0, progress=ctx.progress)
        return self.plan(ctx)
