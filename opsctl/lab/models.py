"""The lab's tiny models: built once on the control machine (`python -m ddtree.tiny`) and cached, so
`opsctl provision -i inventory/lab.yaml` finds the sources that inventory/lab.yaml names.

One build per arch at a time: a caller takes <root>/.<arch>.lock (the lock the runtime tests' tiny cache,
tests/runtime/tiny_cache.py, takes on the same root) and looks again once it holds it, so two labs coming up
at once, or a lab and a test run, share one build instead of training the same model twice."""

from __future__ import annotations

import fcntl
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from opsctl.errors import LabError
from opsctl.lab.inventory import TINY_DIR
from opsctl.progress import Ticker, run_streamed, stderr_line

LAB_ARCH = "qwen3"
BUILD_TIMEOUT_S = 1800
BUILDER = (sys.executable, "-m", "ddtree.tiny")
LOGGER_PREFIX = "ddtree.tiny: "  # the builder logs `%(name)s: %(message)s` on stderr


def lab_models_dir(root: Path = Path(TINY_DIR), arch: str = LAB_ARCH) -> Path:
    """Where the lab's tiny target and drafter are (`<dir>/target`, `<dir>/draft`)."""
    return root / arch


def ensure_tiny_models(
    root: Path = Path(TINY_DIR),
    arch: str = LAB_ARCH,
    builder: Sequence[str] = BUILDER,
    progress: Callable[[str], None] = stderr_line,
) -> bool:
    """Build the tiny target + drafter for `arch` unless a complete build is cached. True when built now."""
    out = lab_models_dir(root, arch)
    if _is_current(out):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    with (root / f".{arch}.lock").open("w") as lock:
        if not _try_lock(lock.fileno()):
            progress(f"tiny {arch} models: waiting for the build another process runs")
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _is_current(out):
            return False
        _build(out, arch, builder, progress)
    return True


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _build(out: Path, arch: str, builder: Sequence[str], progress: Callable[[str], None]) -> None:
    argv = [*builder, "--arch", arch, "--out", str(out)]
    if out.exists():
        argv.append("--force")  # an incomplete earlier build
    with Ticker(f"tiny {arch} models (once)", out=progress) as ticker:
        done = run_streamed(argv, lambda line: _on_line(ticker, line), timeout=BUILD_TIMEOUT_S)
        if done.timed_out:
            raise LabError(f"building the lab's tiny models timed out after {BUILD_TIMEOUT_S}s")
        if done.exit_code != 0:
            if any("No module named ddtree" in line for line in done.tail):
                raise LabError("the lab's tiny models need ddtree-runtime", "pip install -e ./runtime")
            last = (done.tail or ("no output",))[-1]
            raise LabError(f"building the lab's tiny models failed: {last}", f"run `{' '.join(argv)}` to see why")


def _on_line(ticker: Ticker, line: str) -> None:
    """The builder's log lines (`ddtree.tiny: target step 50/400, loss 2.310`) as progress."""
    text = line.strip()
    if text.startswith(LOGGER_PREFIX):
        ticker.update(text.removeprefix(LOGGER_PREFIX))


def _is_current(out: Path) -> bool:
    """A complete build made by the installed runtime's tiny-model builder (build.json's build_version)."""
    if not ((out / "target" / "config.json").is_file() and (out / "draft" / "config.json").is_file()):
        return False
    try:
        built = json.loads((out / "build.json").read_text()).get("build_version")
    except (OSError, ValueError):
        return False
    try:
        from ddtree.tiny_version import BUILD_VERSION  # no torch: `lab up` stays quick
    except ImportError:
        return True  # no runtime here to rebuild with: use what is cached
    return bool(built == BUILD_VERSION)
