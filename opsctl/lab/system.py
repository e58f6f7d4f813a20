"""Running the control machine's tools for the lab (ip, mount, mmdebstrap, ssh-keygen); failures -> LabError."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from opsctl.errors import LabError
from opsctl.progress import Ticker, run_streamed

log = logging.getLogger("opsctl.lab")

# tool -> Debian package that provides it
TOOLS = {
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "mount": "mount",
}
APT_PACKAGES = ("systemd-container", "mmdebstrap", "iproute2", "openssh-client", "rsync")
APT_COMMAND = "apt-get install -y " + " ".join(APT_PACKAGES)


def preflight() -> None:
    """Root and every tool present, or one line naming what is missing and the apt-get command."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, systemd-nspawn)", "run it with sudo")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        packages = sorted({TOOLS[t] for t in missing})
        raise LabError(
            f"the lab needs {', '.join(missing)} (package {', '.join(packages)})",
            f"run: {APT_COMMAND}",
        )


def run(*argv: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    log.debug("lab: %s", " ".join(argv))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LabError(f"`{' '.join(argv)}` timed out after {timeout:g}s") from None
    except FileNotFoundError:
        raise LabError(f"`{argv[0]}` is not installed", f"run: {APT_COMMAND}") from None
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise LabError(f"`{' '.join(argv)}` exited {proc.returncode}: {last[0]}")
    return proc


def run_progress(
    argv: Sequence[str], ticker: Ticker, detail: Callable[[str], str | None], timeout: float = 120.0
) -> None:
    """Run a long tool with its output turned into progress (`detail` picks the lines worth showing)."""
    log.debug("lab: %s", " ".join(argv))

    def on_line(line: str) -> None:
        if (text := detail(line)) is not None:
            ticker.update(text)

    try:
        done = run_streamed(argv, on_line, timeout=timeout)
    except FileNotFoundError:
        raise LabError(f"`{argv[0]}` is not installed", f"run: {APT_COMMAND}") from None
    if done.timed_out:
        raise LabError(f"`{' '.join(argv)}` timed out after {timeout:g}s")
    if done.exit_code != 0:
        raise LabError(f"`{' '.join(argv)}` exited {done.exit_code}: {(done.tail or ('',))[-1]}")


def ok(*argv: str) -> bool:
    """Run, report success; for idempotent teardown steps whose failure means 'already gone'."""
    return run(*argv, check=False).returncode == 0
