"""`python install_runtime.py RUNTIME_DIR TARGET_DIR`: install the ddtree runtime (runtime/pyproject.toml's
package `ddtree`) into TARGET_DIR with its installed metadata, entry points included, so SGLang finds the plugin
through `importlib.metadata.entry_points(group="sglang.srt.plugins")`, as on a deployed host.

run.sh builds a real wheel with `pip wheel --no-build-isolation` where setuptools is importable; this is the
fallback for a Python without setuptools and without a package index (the H200 dev machine): what installing that
wheel would leave behind (the package files, a `.dist-info` with METADATA, entry_points.txt, RECORD,
INSTALLER), written directly. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
import tomllib
from pathlib import Path


def _record_line(root: Path, path: Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(root).as_posix()},sha256={digest},{path.stat().st_size}"


def install(runtime: Path, target: Path) -> Path:
    project = tomllib.loads((runtime / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    dist = target / f"{name.replace('-', '_')}-{version}.dist-info"
    for old in target.glob(f"{name.replace('-', '_')}-*.dist-info"):
        shutil.rmtree(old)
    package = target / "ddtree"
    if package.exists():
        shutil.rmtree(package)
    shutil.copytree(runtime / "ddtree", package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist.mkdir(parents=True)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    (dist / "METADATA").write_text("\n".join(metadata) + "\n")
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in entries.items()) + "\n"
        for group, entries in groups.items()
    )
    (dist / "entry_points.txt").write_text(entry_points)
    (dist / "top_level.txt").write_text("ddtree\n")
    (dist / "INSTALLER").write_text("dev/sglang_gpu/install_runtime.py\n")
    files = sorted(p for p in [*package.rglob("*"), *dist.iterdir()] if p.is_file())
    record = [_record_line(target, p) for p in files] + [f"{(dist / 'RECORD').relative_to(target).as_posix()},,"]
    (dist / "RECORD").write_text("\n".join(record) + "\n")
    return dist


if __name__ == "__main__":
    print(install(Path(sys.argv[1]), Path(sys.argv[2])))
