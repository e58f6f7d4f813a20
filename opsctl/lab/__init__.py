"""Disposable local test hosts: systemd-nspawn containers booting real systemd, reached over SSH."""

from opsctl.lab.config import LabConfig
from opsctl.lab.lifecycle import (
    HostStatus,
    LabReport,
    cut_host,
    down,
    remove_host,
    start_host,
    status,
    stop_host,
    up,
)

__all__ = [
    "HostStatus",
    "LabConfig",
    "LabReport",
    "cut_host",
    "down",
    "remove_host",
    "start_host",
    "status",
    "stop_host",
    "up",
]
