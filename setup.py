"""Build-time only: an opsctl wheel carries its playbooks, requirement locks and a ddtree-runtime wheel built from
runtime/, under opsctl/data/ (where `opsctl.bundle` finds them outside a checkout). Everything else about the
package is in pyproject.toml. An editable install reads the checkout itself and skips this.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _runtime_build() -> ModuleType:
    # loaded by path: opsctl's own dependencies are absent from an isolated build environment
    spec = importlib.util.spec_from_file_location("_opsctl_runtime_build", HERE / "opsctl" / "runtime_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithBundle(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        data = Path(self.build_lib) / "opsctl" / "data"
        for name in ("playbooks", "locks"):
            if not (HERE / name).is_dir():
                raise SystemExit(f"opsctl build: {HERE / name} is missing (build from a checkout or its sdist)")
            shutil.copytree(HERE / name, data / name, dirs_exist_ok=True)
        if not (HERE / "runtime" / "pyproject.toml").is_file():
            raise SystemExit(f"opsctl build: no runtime sources at {HERE / 'runtime'}")
        runtime = data / "runtime"
        shutil.rmtree(runtime, ignore_errors=True)
        builder = _runtime_build()
        try:
            builder.build_wheel(HERE / "runtime", runtime)
        except builder.BuildFailed as exc:
            raise SystemExit(f"opsctl build: building the ddtree-runtime wheel failed: {exc}") from None


setup(cmdclass={"build_py": BuildPyWithBundle})
