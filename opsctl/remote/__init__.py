"""The only module that touches SSH: the Connection seam, its SSH/local/fake implementations, and the pool."""

from opsctl.remote.base import Connect, Connection, RunResult, SecretOnCommandLine
from opsctl.remote.local import LocalHost
from opsctl.remote.pool import HostOutcome, run_parallel
from opsctl.remote.ssh import SshHost, connect

__all__ = [
    "Connect",
    "Connection",
    "HostOutcome",
    "LocalHost",
    "RunResult",
    "SecretOnCommandLine",
    "SshHost",
    "connect",
    "run_parallel",
]
