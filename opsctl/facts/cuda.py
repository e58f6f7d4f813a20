"""Facts about the CUDA toolkit: pure parser over `nvcc --version`."""

from __future__ import annotations

import re

from opsctl.errors import FactError


def parse_nvcc_version(exit_code: int, stdout: str) -> str | None:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0'; None when nvcc is absent."""
    if exit_code != 0:
        return None
    match = re.search(r"release (\d+\.\d+),", stdout)
    if not match:
        raise FactError("nvcc --version: no 'release X.Y,' in the output")
    return match[1]


def toolkit_version(package: str) -> str:
    """'cuda-toolkit-13-0' -> '13.0' (the release nvcc must report)."""
    match = re.fullmatch(r"cuda-toolkit-(\d+)-(\d+)", package)
    if not match:
        raise FactError(
            f"cuda toolkit package {package!r} is not of the form cuda-toolkit-MAJOR-MINOR",
            "set cuda.toolkit_package in the inventory, e.g. cuda-toolkit-13-0",
        )
    return f"{match[1]}.{match[2]}"
