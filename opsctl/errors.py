"""One error tree. Every expected failure is an OpsctlError: one line of what is wrong plus the next step.

Third-party exceptions are translated into these at the boundary (remote, http, inventory loading), so the
CLI never shows a traceback for an expected failure.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes; documented in the README."""

    OK = 0
    ERROR = 1
    CHANGES_PENDING = 2  # --plan: changes would be made
    REBOOT_REQUIRED = 3  # provision: a driver install needs a reboot and --reboot was not given
    INTERRUPTED = 130  # Ctrl-C


class OpsctlError(Exception):
    """Root of every expected failure. `message` says what is wrong, `hint` what to do next."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message.strip().replace("\n", " ")
        return f"{text} ({self.hint})" if self.hint else text


class InventoryError(OpsctlError):
    """The inventory is invalid. `path` is the dotted key path, e.g. hosts.ct200.services.gpu1.port."""

    def __init__(self, path: str, message: str, hint: str | None = None) -> None:
        self.path = path
        self.detail = message  # the message without the path
        super().__init__(f"{path}: {message}" if path else message, hint)


class SelectorError(OpsctlError):
    """A --host/--service selector matched nothing (never silently 'all')."""


class RemoteError(OpsctlError):
    """A command on a host failed. Carries the host, the (masked) command, exit code and output tail."""

    def __init__(
        self,
        host: str,
        command: str,
        exit_code: int | None,
        tail: str = "",
        message: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.host = host
        self.command = command
        self.remote_exit_code = exit_code
        self.tail = tail
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        text = message or f"{host}: `{command}` exited {exit_code}" + (f": {last}" if last else "")
        super().__init__(text, hint)


def host_line(host: str, line: str) -> str:
    """`line` about `host` (a host, or `host/service`), prefixed with it once: never `lab2: lab2: unreachable`,
    nor `lab2/ref: lab2: unreachable` (the service's label replaces the host's own prefix)."""
    if line.startswith(f"{host}: ") or line.startswith(f"{host}/"):
        return line
    bare = host.split("/", 1)[0]
    if bare != host and line.startswith(f"{bare}: "):
        line = line[len(bare) + 2 :]
    return f"{host}: {line}"


def without_prefixes(line: str, *words: str) -> str:
    """`line` without the leading `word: ` of each of `words` that it starts with, in any order: what the caller
    prints just before it already says (`lab2/ref: unreachable` + `lab2: unreachable: timed out`)."""
    stripped = True
    while stripped:
        stripped = False
        for word in words:
            if word and line.startswith(f"{word}: "):
                line, stripped = line[len(word) + 2 :], True
    return line


class UnreachableError(OpsctlError):
    def __init__(self, host: str, reason: str, hint: str | None = None) -> None:
        self.host = host
        super().__init__(f"{host}: unreachable: {reason}", hint or "check the address, port and that sshd runs")


class HostKeyError(OpsctlError):
    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        super().__init__(
            f"{host}: host key rejected: {reason}",
            "verify the host's key and update known_hosts (or set host_key_policy: accept-new for a new host)",
        )


class CommandTimeout(OpsctlError):
    def __init__(self, host: str, command: str, seconds: float) -> None:
        self.host = host
        self.command = command
        super().__init__(f"{host}: `{command}` timed out after {seconds:g}s", "raise the timeout or check the host")


class LabError(OpsctlError):
    pass


class DeployError(OpsctlError):
    pass


class HealthError(OpsctlError):
    pass


class SmokeError(OpsctlError):
    pass


class RebootRequired(OpsctlError):
    exit_code = ExitCode.REBOOT_REQUIRED


class FactError(OpsctlError):
    """A command's output could not be parsed (unexpected or malformed)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint or "run the command by hand on the host and check its output")


class ProvisionError(OpsctlError):
    """A desired state cannot be reached (host too old, package missing, verification failed)."""


class NoGpuError(ProvisionError):
    pass


class AbiMismatchError(ProvisionError):
    """An extension module was built against another torch (`undefined symbol`)."""


class ShmTooSmallError(ProvisionError):
    pass


class ManifestMismatchError(ProvisionError):
    pass


class ModelNotTrustedError(ProvisionError):
    """A model source differs from the model accepted on the host: corrupt or replaced; nothing is copied."""
