"""Import SGLang 0.5.23 on a CPU-only test host (docs/ci.md, "Importing SGLang without a GPU"), and run the
runtime tier's SGLang probes after one import (`run_probes`).

The test environment has torch 2.13 (CPU) and sglang installed with --no-deps plus the few modules its import
chain needs (.ci/sglang-test-requirements.txt). One module cannot be installed honestly: the only torchvision
wheels on PyPI are CUDA builds that do not load against a CPU torch, and a torchvision that fails at import also
breaks `transformers` for every other test in the environment. SGLang imports torchvision at module level only
for multimodal image preprocessing (e.g. `sglang/srt/multimodal/internvl_utils.py`), which the plugin never
runs. So, in the processes that import SGLang here (always subprocesses started by the tests, never the pytest
process itself), a missing or broken torchvision is replaced by an inert stub before SGLang is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent

# Prepend to a `python -c` script: makes `import sglang` work here, quietly.
PRELUDE = f"""
import sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {str(HERE)!r})
import sglang_cpu
sglang_cpu.import_sglang()
"""


class _InertMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls


class _Inert(metaclass=_InertMeta):
    """Any attribute, call or subclass of the stub is this same inert class."""


class _InertModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+inert"  # transformers parses it once it finds the package
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


def _torchvision_or_stub() -> str:
    """'real' if torchvision imports, else installs the stub and returns 'stub'."""
    try:
        importlib.import_module("torchvision")
        return "real"
    except (ImportError, RuntimeError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionStub())
        return "stub"


def import_sglang() -> ModuleType:
    """Import sglang and the modules the plugin uses; raises ImportError if sglang is not installed."""
    if importlib.util.find_spec("sglang") is None:
        raise ImportError("sglang is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _torchvision_or_stub()
        if os.environ.get("TRITON_INTERPRET") == "1":
            import triton_interpreter  # beside this file: the interpreter's device calls made cheap

            triton_interpreter.install()
        sglang = importlib.import_module("sglang")
        importlib.import_module("sglang.srt.plugins")
        importlib.import_module("sglang.srt.speculative.spec_info")
    return sglang


def sglang_skip_reason() -> str | None:
    """None if sglang is installed, else why the SGLang contract tests are skipped. Checked without importing
    it here: SGLang is only ever imported in subprocesses."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed (CI installs .ci/sglang-test-requirements.txt)"
    return None


@dataclass(frozen=True)
class Probe:
    """A script run with SGLang imported, as `python -c PRELUDE + code *args` would run it."""

    code: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeResult:
    returncode: int
    stdout: str
    stderr: str


# After PRELUDE: each probe runs in a child forked from the process that imported SGLang, one at a time, so every
# probe starts from SGLang just imported (none sees what another changed: os.environ, SGLang's registries) and the
# import (~12 CPU-s) is paid once. Each child's stdout and stderr go to files of its own.
_FORKS = r"""
import json, os, sys, tempfile, traceback
probes = json.load(open(sys.argv[1]))
results = {}
for name, probe in probes.items():
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        status = 0
        try:
            sys.argv = ["-c", *probe["args"]]
            exec(compile(probe["code"], f"<probe {name}>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc(); status = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    out.seek(0); err.seek(0)
    results[name] = {"returncode": os.waitstatus_to_exitcode(wait_status),
                     "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}
json.dump(results, open(sys.argv[2], "w"))
"""


def run_probes(probes: Mapping[str, Probe], workdir: Path, timeout: float = 900) -> dict[str, ProbeResult]:
    """Every probe's result, from one subprocess that imports SGLang once, with TRITON_INTERPRET=1 (SGLang's Triton
    kernels run by Triton's CPU interpreter: it must be set before triton is imported)."""
    request, answer = workdir / "probes.json", workdir / "results.json"
    request.write_text(json.dumps({name: {"code": p.code, "args": list(p.args)} for name, p in probes.items()}))
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + _FORKS, str(request), str(answer)],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the SGLang probe process exited with {done.returncode}:\n{done.stderr[-4000:]}")
    return {name: ProbeResult(**result) for name, result in json.loads(answer.read_text()).items()}
