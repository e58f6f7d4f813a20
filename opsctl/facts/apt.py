"""Facts about Debian packages: pure parsers over `apt-cache policy`, `dpkg-query` and /etc/os-release."""

from __future__ import annotations

import re
from dataclasses import dataclass

from opsctl.errors import FactError


@dataclass(frozen=True)
class AptPolicy:
    package: str
    installed: str | None  # None = "(none)"
    candidate: str | None  # None = "(none)" or the package is unknown to apt


@dataclass(frozen=True)
class OsRelease:
    id: str  # ubuntu, debian
    version_id: str  # 24.04, 12

    @property
    def cuda_repo(self) -> str:
        """The directory name of NVIDIA's CUDA apt repository: ubuntu2404, debian12."""
        return f"{self.id}{self.version_id.replace('.', '')}"


def parse_apt_policy(package: str, text: str) -> AptPolicy:
    """Parse `apt-cache policy PKG`. Empty output or 'Unable to locate' means apt does not know the package."""
    if not text.strip() or "Unable to locate package" in text:
        return AptPolicy(package, None, None)
    header = f"{package}:"
    lines = text.splitlines()
    if not any(line.strip() == header for line in lines):
        raise FactError(f"apt-cache policy {package}: no '{header}' header in the output")
    fields: dict[str, str | None] = {}
    for line in lines:
        match = re.match(r"^\s+(Installed|Candidate):\s*(\S+)\s*$", line)
        if match:
            value = match[2]
            fields[match[1]] = None if value == "(none)" else value
    if "Installed" not in fields or "Candidate" not in fields:
        raise FactError(f"apt-cache policy {package}: missing Installed:/Candidate: lines")
    return AptPolicy(package, fields["Installed"], fields["Candidate"])


def parse_dpkg_status(exit_code: int, text: str) -> str | None:
    """Parse `dpkg-query -W -f='${Status} ${Version}' PKG`: the installed version, or None."""
    if exit_code != 0:
        return None  # "dpkg-query: no packages found matching PKG"
    parts = text.split()
    if len(parts) == 4 and parts[:3] == ["install", "ok", "installed"]:
        return parts[3]
    if len(parts) >= 3 and parts[2] in ("installed", "config-files", "not-installed", "half-installed"):
        return None
    raise FactError(f"dpkg-query: unexpected status {text.strip()!r}")


def parse_os_release(text: str) -> OsRelease:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    if "ID" not in values or "VERSION_ID" not in values:
        raise FactError("/etc/os-release: missing ID or VERSION_ID")
    return OsRelease(values["ID"], values["VERSION_ID"])


def upstream_major(version: str) -> int:
    """The leading integer of a Debian version: '580.95.05-0ubuntu1' -> 580, '1:13.0.2-1' -> 13."""
    match = re.match(r"^(?:\d+:)?(\d+)", version)
    if not match:
        raise FactError(f"package version {version!r} does not start with a number")
    return int(match[1])
