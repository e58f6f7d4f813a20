"""`StagedRelease`: one service's release as a value, rendered once per deploy and read by every step.

Hash, staging, pre-flight, the manifest and `--plan` all take what they need from it: the files with their
modes (the revealed text written to the host, and the masked copy shown, diffed and digested), the unit's
argv, the server's flags, the secrets for the fingerprint, and the hash inputs. Pure: no I/O but the renderer's
templates and reading the secrets.

The release id holds the config hash, and the files hold the release id (their release dir), so the service
is rendered once with `PLACEHOLDER_ID` (same length and alphabet as a real id, so quoting is the same), the
hash is taken of that rendering as it is (no substitution), and `bind()` puts the real id in: rendering at the
real id gives the same files (tests/unit/test_release.py checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from opsctl.deploy import release
from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host, Service
from opsctl.render import Secrets, render_service
from opsctl.secrets import SecretError

PLACEHOLDER_ID = release.PLACEHOLDER_ID


@dataclass(frozen=True)
class StagedFile:
    name: str  # "unit", "env", "server.yaml"
    text: str = field(repr=False)  # what is written to the host (secrets revealed); "" when not at hand
    masked: str  # the same with secrets as *** (shown, diffed, digested, hashed)
    mode: int


@dataclass(frozen=True)
class StagedRelease:
    release_id: str
    files: tuple[StagedFile, ...]
    argv: tuple[str, ...]  # the unit's ExecStart
    flags: tuple[str, ...]  # the server's flags in argv form (API key as ***)
    secrets: Mapping[str, str] = field(repr=False)  # name -> value, for the fingerprint; {} when none
    reveal_error: OpsctlError | None = field(default=None, repr=False)  # why the files cannot be revealed
    secrets_error: SecretError | None = field(default=None, repr=False)  # why the secrets are not at hand
    # (masked files by name, argv) as rendered with PLACEHOLDER_ID: what the config hash covers
    hash_inputs: tuple[tuple[tuple[str, str], ...], tuple[str, ...]] = field(default=((), ()), repr=False)

    @staticmethod
    def render(host: Host, service: Service) -> StagedRelease:
        """The service's release, not yet bound to an id (its files name PLACEHOLDER_ID)."""
        masked = render_service(host, service, PLACEHOLDER_ID, Secrets.MASK)
        try:  # `opsctl render` and the hash need no secret; --plan and staging check it (checked_secrets)
            secrets, secrets_error = _secrets(service), None
        except SecretError as exc:
            secrets, secrets_error = {}, exc
        try:
            revealed = render_service(host, service, PLACEHOLDER_ID, Secrets.REVEAL)
            texts, error = {f.name: f.text for f in revealed.files}, None
        except OpsctlError as exc:
            texts, error = {}, exc
        files = tuple(StagedFile(f.name, texts.get(f.name, ""), f.text, f.mode) for f in masked.files)
        inputs = (tuple((f.name, f.masked) for f in files), masked.exec_start)
        return StagedRelease(
            PLACEHOLDER_ID, files, masked.exec_start, masked.flags, secrets, error, secrets_error, inputs
        )

    def bind(self, release_id: str) -> StagedRelease:
        """The same release under its real id (the id appears in the files as their release dir)."""
        old = self.release_id

        def put(text: str) -> str:
            return text.replace(old, release_id)

        files = tuple(StagedFile(f.name, put(f.text), put(f.masked), f.mode) for f in self.files)
        argv = tuple(put(a) for a in self.argv)
        return StagedRelease(
            release_id, files, argv, self.flags, self.secrets, self.reveal_error, self.secrets_error, self.hash_inputs
        )

    # ------------------------------------------------------------ what each step reads

    def config_hash(self, runtime_sha256: str, models: str) -> str:
        """Of the masked files and argv as rendered with PLACEHOLDER_ID: depends neither on a secret nor on
        the id it becomes part of."""
        files, argv = self.hash_inputs
        return release.config_hash(dict(files), argv, runtime_sha256, models)

    def revealed(self) -> tuple[StagedFile, ...]:
        """The files to write; raises the SecretError when a secret could not be read."""
        if self.reveal_error is not None:
            raise self.reveal_error
        return self.files

    def checked_secrets(self) -> Mapping[str, str]:
        """The secrets; raises the SecretError when one could not be read."""
        if self.secrets_error is not None:
            raise self.secrets_error
        return self.secrets

    @property
    def server_args(self) -> tuple[str, ...]:
        """Every argument the server is given (flags from server.yaml, then the unit's extra args)."""
        return (*self.flags, *self.argv[3:])

    def digests(self) -> dict[str, str]:
        return release.file_digests({f.name: f.masked for f in self.files})


def _secrets(service: Service) -> dict[str, str]:
    return {"api_key": service.api_key.reveal()} if service.api_key is not None else {}
