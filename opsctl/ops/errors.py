"""Errors raised by provisioning operations (all OpsctlError: one line plus the next step)."""

from __future__ import annotations

from opsctl.errors import OpsctlError


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
