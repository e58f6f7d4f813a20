"""The ddtree-runtime wheel, the one artifact every release installs: in a checkout, built on the control machine
(cached by a hash of the runtime's sources); in an installed opsctl, the wheel it carries (`opsctl.bundle`). Kept on
each host at a content-addressed path, pushed when absent.

Provision (the `runtime_wheel` operation) and deploy (staging) both use this module: one builder, one layout
(`/opt/opsctl/wheels/<sha256[:16]>/<wheel>`), one check and one push. Wheels of one version built from
different sources never overwrite each other, and provision's push is the copy deploy installs from.
"""

from __future__ import annotations

import fcntl
import os
import posixpath
import shutil
import tempfile
from pathlib import Path

from opsctl import bundle, runtime_build
from opsctl.commands import Cmd
from opsctl.errors import DeployError
from opsctl.remote.base import Connection
from opsctl.wheel import RuntimeWheel

# ---------------------------------------------------------------- build


def cache_dir() -> Path:
    return Path.home() / ".cache" / "opsctl" / "wheels"


def runtime_wheel(explicit: Path | None = None, src: Path | None = None) -> RuntimeWheel:
    """An explicit wheel file; else, in a checkout (or with `src`), the runtime built from source (cached per source
    hash); else the wheel an installed opsctl carries."""
    if explicit is not None:
        if not explicit.is_file() or explicit.suffix != ".whl":
            raise DeployError(f"runtime wheel {explicit} is not a .whl file", "pass --runtime-wheel PATH.whl")
        return RuntimeWheel.of(explicit)
    src = src or bundle.runtime_src()
    if src is None:
        bundled = bundle.bundled_runtime_wheel()
        if bundled is None:
            raise DeployError(
                "this opsctl carries no ddtree-runtime wheel (it was built without runtime/)",
                "pass --runtime-wheel PATH.whl (a built ddtree-runtime), or reinstall opsctl from its wheel",
            )
        return RuntimeWheel.of(bundled)
    if not (src / "pyproject.toml").is_file():
        raise DeployError(f"no runtime sources at {src}", "pass --runtime-wheel PATH.whl (a built ddtree-runtime)")
    target = cache_dir() / runtime_build.source_hash(src)
    target.mkdir(parents=True, exist_ok=True)
    # one build per source hash: a concurrent caller (parallel test tiers, two opsctl runs) waits for it, then
    # takes the same wheel (wheels carry build times, so two builds would give two sha256s, two releases)
    with (target / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(target.glob(runtime_build.WHEEL_GLOB))
        if not found:
            found = [_build_into(src, target)]
    return RuntimeWheel.of(found[-1])


def _build_into(src: Path, target: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            built = runtime_build.build_wheel(src, Path(tmp))
        except runtime_build.BuildFailed as exc:
            raise DeployError(f"building the runtime wheel failed: {exc}", f"try: pip wheel --no-deps {src}") from None
        # beside, then renamed: a reader that does not take the lock sees the whole wheel or none
        partial = target / f".{built.name}.{os.getpid()}.partial"
        shutil.copy2(built, partial)
        os.replace(partial, target / built.name)
        return target / built.name


# ---------------------------------------------------------------- on a host


def check_cmd(wheel: RuntimeWheel) -> Cmd:
    """A read-only command: the sha256 of the host's copy (non-zero exit when it has none)."""
    return Cmd.of("sha256sum", wheel.remote_path)


def parse_sha256sum(exit_code: int, stdout: str) -> str | None:
    if exit_code != 0 or not stdout.strip():
        return None
    digest = stdout.split()[0]
    return digest if len(digest) == 64 else None


def on_host(conn: Connection, wheel: RuntimeWheel) -> bool:
    """Whether the host already holds this exact wheel at its content-addressed path."""
    result = conn.run(check_cmd(wheel), timeout=120.0, check=False)
    return parse_sha256sum(result.exit_code, result.stdout) == wheel.sha256


def mkdir_cmd(wheel: RuntimeWheel) -> Cmd:
    """The push is this, then the wheel file copied to `wheel.remote_path` (provision plans the same two steps)."""
    return Cmd.of("mkdir", "-p", posixpath.dirname(wheel.remote_path), sudo=True)


def ensure_on_host(conn: Connection, wheel: RuntimeWheel) -> bool:
    """Push the wheel unless the host already has it (same sha256). True when pushed."""
    if on_host(conn, wheel):
        return False
    conn.run(mkdir_cmd(wheel))
    conn.put_file(wheel.path, wheel.remote_path)
    return True
