"""rsync transport for big files: the OpenSSH client with exactly the settings paramiko uses.

paramiko's SFTP is slow for multi-GB models; rsync over `ssh` is fast and resumable. The ssh command is built
here as a value so the host-key rule (strict, the inventory's known_hosts only) is the same on both paths.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from opsctl.errors import HostKeyError, OpsctlError, RemoteError, UnreachableError
from opsctl.inventory.model import Endpoint, SshConfig
from opsctl.progress import human_bytes

# Whole-transfer progress (one line, rewritten with \r; Popen's universal newlines make each a line).
PROGRESS_FLAGS = ["--info=progress2", "--no-inc-recursive"]
# The counter, and the `(xfr#2, to-chk=2/5)` that follows it once a file is done. What comes after it on the same
# line is not progress: rsync's stderr shares the pipe, and its error lands right after the last counter with no
# line break (`... 0:00:00 (xfr#1, to-chk=1/3)rsync: [receiver] write failed on ...: No space left on device`).
_PROGRESS = re.compile(
    r"^\s*([\d,]+)\s+(\d+)%\s+(\S+/s)\s+(\d+:\d{2}:\d{2})(?:\s+\((?:xfr#\d+, )?(?:to|ir)-chk=\d+/\d+\))?[ \t]*"
)

# rsync exit codes that mean the transport failed (not the copy): 255 = ssh itself, 12/10 = stream/socket.
_TRANSPORT_CODES = {10, 12, 255}


def ssh_command(config: SshConfig, known_hosts: Path, key_file: str | None, jump: Endpoint | None) -> list[str]:
    """`ssh` argv (without destination) for rsync -e. Host keys are already checked/recorded by paramiko,
    so StrictHostKeyChecking is always yes here."""
    argv = [
        "ssh",
        "-p",
        str(config.port),
        *_options(config, known_hosts),
    ]
    if key_file:
        argv += ["-i", key_file, "-o", "IdentitiesOnly=yes"]
    if jump is not None:
        hop = ["ssh", "-p", str(jump.port), *_options(config, known_hosts)]
        if key_file:
            hop += ["-i", key_file, "-o", "IdentitiesOnly=yes"]
        hop += ["-W", "%h:%p", f"{jump.user}@{jump.address}"]
        argv += ["-o", "ProxyCommand=" + shlex.join(hop)]
    return argv


def _options(config: SshConfig, known_hosts: Path) -> list[str]:
    opts = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": str(known_hosts),
        "GlobalKnownHostsFile": "/dev/null",
        "ConnectTimeout": str(max(1, int(config.connect_timeout))),
        "ServerAliveInterval": str(config.keepalive),
        "ServerAliveCountMax": "1",  # gone after 2 intervals unanswered, as opsctl.remote.peerwatch
        "LogLevel": "ERROR",
    }
    argv: list[str] = []
    for key, value in opts.items():
        argv += ["-o", f"{key}={value}"]
    return argv


def parse_progress(line: str) -> str | None:
    """`  134,217,728  50%   95.12MB/s    0:00:01 (xfr#2, to-chk=2/5)` -> `134.2 MB (50%), 95.12MB/s, ETA 0:00:01`;
    None for any other line."""
    m = _PROGRESS.match(line)
    if m is None:
        return None
    done = int(m[1].replace(",", ""))
    return f"{human_bytes(done)} ({m[2]}%), {m[3]}, ETA {m[4]}"


def split_progress(line: str) -> tuple[str | None, str]:
    """(the progress counter as parse_progress shows it, or None; what follows it on the same line). Pure."""
    m = _PROGRESS.match(line)
    if m is None:
        return None, line.strip()
    return parse_progress(line), line[m.end() :].strip()


def error_tail(lines: Iterable[str]) -> str:
    """rsync's own words from its merged, \\r-split output: the progress counters dropped, and what was glued to
    one of them kept as a line of its own."""
    return "\n".join(rest for rest in (split_progress(line)[1] for line in lines) if rest)


def rsync_error(host: str, display: str, code: int, stderr: str) -> OpsctlError:
    """Translate a failed rsync into the error tree."""
    text = stderr.strip()
    if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return HostKeyError(host, f"ssh (rsync) refused the host key: {text.splitlines()[-1]}")
    if code in _TRANSPORT_CODES and "No space left on device" not in text:  # a full disk also ends the stream
        last = text.splitlines()[0] if text else f"rsync exited {code}"
        return UnreachableError(host, f"rsync transport failed: {last}")
    return RemoteError(host, display, code, text)
