"""Where opsctl puts things on a host (docs/architecture.md, "On the host"). One place, so every module agrees:
the service dirs, the release dirs, `current`, and the unit name (`opsctl-<service>.service`)."""

from __future__ import annotations

OPSCTL_ROOT = "/opt/opsctl"
SERVICES_ROOT = f"{OPSCTL_ROOT}/services"
UNIT_DIR = "/etc/systemd/system"
AUDIT_LOG = "/var/lib/opsctl/audit.log"
SGLANG_CACHE_ROOT = "/var/cache/opsctl/sglang"


def service_root(service: str) -> str:
    return f"{SERVICES_ROOT}/{service}"


def releases_dir(service: str) -> str:
    return f"{service_root(service)}/releases"


def release_dir(service: str, release_id: str) -> str:
    return f"{releases_dir(service)}/{release_id}"


def current_link(service: str) -> str:
    return f"{service_root(service)}/current"


def unit_name(service: str) -> str:
    return f"opsctl-{service}.service"


def unit_path(service: str) -> str:
    return f"{UNIT_DIR}/{unit_name(service)}"
