"""Disposable local test hosts: systemd-nspawn containers booting real systemd, reached over SSH."""

from opsctl.lab.config import LabConfig
from opsctl.lab.lifecycle import (
    HostStatus,
    LabReport,
    Prepared,
    cut_host,
    down,
    prepare,
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
    "Prepared",
    "cut_host",
    "down",
    "prepare",
    "remove_host",
    "start_host",
    "status",
    "stop_host",
    "up",
]
