"""Facts about NVIDIA GPUs and the driver: pure parsers over `nvidia-smi`, /proc and /sys output."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from opsctl.errors import FactError

# The exact query the parser expects (one CSV line per GPU).
NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=name,driver_version,compute_cap,memory.total",
    "--format=csv,noheader",
)

NVIDIA_PCI_VENDOR = "0x10de"


@dataclass(frozen=True)
class Gpu:
    name: str
    driver_version: str  # e.g. 580.95.05
    compute_cap: tuple[int, int]  # (12, 0) on Blackwell RTX PRO 6000
    memory_mib: int

    @property
    def blackwell(self) -> bool:
        # sm_100 (B200) and sm_120 (RTX PRO 6000 / GeForce 50xx) need the open kernel modules.
        return self.compute_cap[0] >= 10 or "blackwell" in self.name.lower()


class SmiState(StrEnum):
    OK = "ok"  # nvidia-smi listed the GPUs
    MISSING = "missing"  # nvidia-smi is not installed (no driver userspace)
    NO_DRIVER = "no_driver"  # nvidia-smi exists but cannot talk to a loaded kernel module
    MISMATCH = "mismatch"  # userspace and kernel module versions differ (installed, not rebooted)


@dataclass(frozen=True)
class SmiFacts:
    state: SmiState
    gpus: tuple[Gpu, ...] = ()
    detail: str = ""  # the line nvidia-smi printed when it failed


@dataclass(frozen=True)
class KernelModule:
    version: str  # e.g. 580.95.05
    open: bool  # "Open Kernel Module" (required for Blackwell)


def driver_major(version: str) -> int:
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        raise FactError(f"driver version {version!r} is not of the form MAJOR.MINOR[.PATCH]") from None


def parse_nvidia_smi(exit_code: int, stdout: str, stderr: str) -> SmiFacts:
    """Parse `nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader`."""
    text = (stdout + "\n" + stderr).strip()
    if exit_code == 127 or "command not found" in text or "nvidia-smi: not found" in text:
        return SmiFacts(SmiState.MISSING, detail=_first_line(text))
    if "version mismatch" in text.lower():
        return SmiFacts(SmiState.MISMATCH, detail=_first_line(text))
    if exit_code != 0:
        # "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", "No devices were found"
        return SmiFacts(SmiState.NO_DRIVER, detail=_first_line(text))
    gpus = tuple(_parse_gpu_line(line) for line in stdout.splitlines() if line.strip())
    if not gpus:
        return SmiFacts(SmiState.NO_DRIVER, detail="nvidia-smi listed no GPUs")
    return SmiFacts(SmiState.OK, gpus=gpus)


def _parse_gpu_line(line: str) -> Gpu:
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 4:
        raise FactError(f"nvidia-smi: expected 4 CSV fields (name, driver, cc, memory), got {line.strip()!r}")
    name, driver, cap, memory = fields
    match = re.fullmatch(r"(\d+)\.(\d+)", cap)
    if not match:
        raise FactError(f"nvidia-smi: compute capability {cap!r} is not MAJOR.MINOR")
    mem = re.fullmatch(r"(\d+)\s*MiB", memory)
    if not mem:
        raise FactError(f"nvidia-smi: memory.total {memory!r} is not '<n> MiB'")
    driver_major(driver)
    return Gpu(name, driver, (int(match[1]), int(match[2])), int(mem[1]))


def parse_proc_version(exit_code: int, text: str) -> KernelModule | None:
    """Parse /proc/driver/nvidia/version; None when no NVIDIA kernel module is loaded."""
    if exit_code != 0 or not text.strip():
        return None
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            if not match:
                raise FactError(f"/proc/driver/nvidia/version: no version number in {line.strip()!r}")
            return KernelModule(match[1], "Open Kernel Module" in line)
    raise FactError("/proc/driver/nvidia/version: no 'NVRM version:' line")


def parse_pci_vendors(text: str) -> int:
    """Count NVIDIA display/3D controllers from `<vendor> <class>` lines (from /sys/bus/pci/devices/*)."""
    count = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        vendor, klass = parts
        # class 0x03xxxx = display controller (VGA 0x0300, 3D 0x0302); skips NVIDIA audio/USB functions
        if vendor.lower() == NVIDIA_PCI_VENDOR and klass.lower().startswith("0x03"):
            count += 1
    return count


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
