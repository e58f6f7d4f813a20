"""The lab hosts' root filesystem: mmdebstrap once, prepare, cache under cfg.cache_dir.

mmdebstrap rather than debootstrap: apt downloads in parallel and dpkg installs in one pass (37 s vs 63 s for
the same packages on the 2-core dev box, docs/quickstart.md).

Every host mounts the cache read-only as the lower layer of its own overlay, so a new host costs no copy.
The cache directory name includes a hash of the recipe (suite, mirror, packages, preparation version): a
changed recipe builds a new directory and never modifies one that running hosts use.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from opsctl.lab import system
from opsctl.lab.config import ROOTFS_PACKAGES, ROOTFS_RECIPE, LabConfig
from opsctl.progress import Ticker, stderr_line

log = logging.getLogger("opsctl.lab")

SSHD_DROP_IN = """\
# opsctl lab: keys only, no reverse DNS (lab hosts have no resolver)
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""


def cache_path(cfg: LabConfig) -> Path:
    recipe = json.dumps([cfg.suite, cfg.mirror, ROOTFS_PACKAGES, ROOTFS_RECIPE])
    key = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    return cfg.cache_dir / f"rootfs-{cfg.suite}-{key}"


def mmdebstrap_argv(cfg: LabConfig, into: Path) -> list[str]:
    return [
        "mmdebstrap", "--variant=minbase", "--include=" + ",".join(ROOTFS_PACKAGES), cfg.suite, str(into), cfg.mirror,
    ]  # fmt: skip


def mmdebstrap_step(line: str) -> str | None:
    """mmdebstrap's `I: downloading packages with apt...` lines, as progress details; None for other lines."""
    text = line.strip()
    return text[3:] if text.startswith("I: ") else None


def ensure(cfg: LabConfig, out: Callable[[str], None] = stderr_line) -> tuple[Path, float | None]:
    """The cached rootfs, built if missing. Returns (path, build seconds or None when cached)."""
    path = cache_path(cfg)
    if path.is_dir():
        return path, None
    cfg.cache_dir.mkdir(parents=True, exist_ok=True)
    with _build_lock(cfg, out):
        if path.is_dir():  # built by a concurrent caller while we waited
            return path, None
        start = time.monotonic()
        tmp = cfg.cache_dir / f".build-{path.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("building the lab rootfs (%s, about 2 minutes, once)", cfg.suite)
        try:
            with Ticker(f"lab rootfs ({cfg.suite}, once)", out=out) as ticker:
                system.run_progress(mmdebstrap_argv(cfg, tmp), ticker, mmdebstrap_step, timeout=1800)
            prepare(tmp)
            os.rename(tmp, path)  # atomic: a cache directory is complete or absent
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path, time.monotonic() - start


def prepare(root: Path) -> None:
    """Make a bootstrapped tree a template: no host identity (keys, machine-id, hostname) baked in."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    (root / "etc/hostname").unlink(missing_ok=True)
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/opsctl-lab.conf").write_text(SSHD_DROP_IN)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


@contextlib.contextmanager
def _build_lock(cfg: LabConfig, out: Callable[[str], None]) -> Iterator[None]:
    """One build at a time (`scripts/setup` starts one in the background; a `lab up` may come while it runs)."""
    with (cfg.cache_dir / ".build.lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"lab rootfs ({cfg.suite}, once): waiting for the build another process runs")
            with Ticker(f"lab rootfs ({cfg.suite}, once)", out=out):  # a heartbeat while it waits
                fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
