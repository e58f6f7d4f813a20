"""The only module that touches SSH: the Host seam, its SSH/local/fake implementations, and the pool."""

from opsctl.remote.base import Host, RunResult, SecretOnCommandLine
from opsctl.remote.local import LocalHost
from opsctl.remote.pool import HostOutcome, run_parallel
from opsctl.remote.ssh import SshHost, connect

__all__ = [
    "Host",
    "HostOutcome",
    "LocalHost",
    "RunResult",
    "SecretOnCommandLine",
    "SshHost",
    "connect",
    "run_parallel",
]
