"""The `Operation` protocol: read facts -> compare with the desired state -> a plan of actions -> apply.

A plan is a value: an exact, ordered tuple of actions (remote commands, file pushes, small file writes,
verifications). `--plan` prints it; apply executes it action by action and stops at the first failure.
Facts are read with read-only commands only, so planning never changes a host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from opsctl.commands import Cmd
from opsctl.errors import ProvisionError
from opsctl.facts.manifest import Manifest
from opsctl.inventory.model import Host
from opsctl.kernel import audit
from opsctl.localfiles import write_text_atomic
from opsctl.remote.base import Connection, RunResult

if TYPE_CHECKING:
    from opsctl.wheel import RuntimeWheel


@dataclass(frozen=True)
class Push:
    """Copy a local directory's contents (rsync -a) or a single file to the host."""

    local: Path
    remote: str

    def display(self) -> str:
        return f"push {self.local} -> {self.remote}"


@dataclass(frozen=True)
class PutText:
    """Write a small file atomically (temp + rename) on the host."""

    remote: str
    text: str = field(repr=False)
    mode: int = 0o644

    def display(self) -> str:
        return f"write {self.remote} ({len(self.text.encode())} bytes, mode {self.mode:o})"


@dataclass(frozen=True)
class Verify:
    """Run a read-only command and judge its result; `judge` raises an OpsctlError when it is wrong."""

    cmd: Cmd
    judge: Callable[[int, str, str], None] = field(compare=False, repr=False)
    what: str = ""
    shown: str | None = None  # a shorter display of the command (e.g. without an inline script)

    def display(self) -> str:
        shown = self.shown or self.cmd.display()
        return f"verify {self.what}: {shown}" if self.what else f"verify: {shown}"


@dataclass(frozen=True)
class KeepLocal:
    """Write a small file atomically (temp + rename) on the control machine: a copy of what a host must
    remember, kept where losing the host's disk cannot lose it (model_trust's control-machine records)."""

    local: Path
    text: str = field(repr=False)

    def display(self) -> str:
        return f"keep {self.local} on the control machine ({len(self.text.encode())} bytes)"

    def write(self) -> None:
        write_text_atomic(self.local, self.text)


@dataclass(frozen=True)
class Audit:
    """One audit line (opsctl.kernel.audit.record: the control machine's log and the host's), written when the
    actions before it succeeded: an act that changes what opsctl trusts (`--accept-model`)."""

    host: Host = field(repr=False)
    action: str
    detail: str

    def display(self) -> str:
        return f"audit {self.action}: {self.detail}"


Action = Cmd | Push | PutText | Verify | KeepLocal | Audit


def display(action: Action) -> str:
    return action.display() if not isinstance(action, Cmd) else ("sudo " if action.sudo else "") + action.display()


@dataclass(frozen=True)
class Plan:
    op: str
    actions: tuple[Action, ...] = ()
    notes: tuple[str, ...] = ()  # one-line facts worth showing ("no NVIDIA GPU detected")
    reboot_required: bool = False  # the host needs a reboot before this step can be checked again

    @property
    def changes(self) -> bool:
        return bool(self.actions)

    def commands(self) -> list[str]:
        return [display(a) for a in self.actions]


@dataclass(frozen=True)
class Options:
    reboot: bool = False  # allowed to reboot a host after a driver install
    require_gpu: bool = False  # a host without an NVIDIA GPU is an error
    reboot_timeout: float = 900.0  # seconds to wait for SSH after a reboot
    # model paths whose source may differ from the model accepted on the host (`--accept-model`)
    accept_models: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Artifacts:
    """Things built once per run on the control machine and shared by every host."""

    wheelhouses: Mapping[str, Path] = field(default_factory=dict)  # profile -> local wheel dir to push
    runtime_wheel: RuntimeWheel | None = None  # the ddtree-runtime wheel built from runtime/ (opsctl.artifact)
    manifests: Mapping[str, Manifest] = field(default_factory=dict)  # control-side model source -> manifest
    router_wheelhouses: Mapping[str, Path] = field(default_factory=dict)  # host name -> its routers' wheels


@dataclass(frozen=True)
class Context:
    spec: Host  # the inventory's view of the host
    remote: Connection
    options: Options = field(default_factory=Options)
    artifacts: Artifacts = field(default_factory=Artifacts)
    progress: Callable[[str], None] | None = None  # hears about long waits (copy bytes, rate, ETA)


class Operation(Protocol):
    name: str

    def plan(self, ctx: Context) -> Plan:
        """Read facts (read-only commands) and return the actions that reach the desired state."""
        ...

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        """Execute the plan; return the plan that remains afterwards (normally empty, or reboot_required)."""
        ...


def execute(
    remote: Connection,
    actions: tuple[Action, ...],
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Run the actions in order; the first failure raises (RemoteError, or the judge's error). `progress`
    hears which action runs, and about long copies (bytes, rate, ETA)."""
    for number, action in enumerate(actions, 1):
        if progress is not None:
            shown = display(action)
            progress(f"{number}/{len(actions)} {shown if len(shown) <= 100 else shown[:99] + '…'}")
        if isinstance(action, Cmd):
            remote.run(action, timeout=timeout)
        elif isinstance(action, Push):
            _push(remote, action, progress)
        elif isinstance(action, PutText):
            remote.put_text(action.text, action.remote, mode=action.mode)
        elif isinstance(action, KeepLocal):
            action.write()
        elif isinstance(action, Audit):
            audit.record(action.host, "-", action.action, None, "ok", action.detail, conn=remote)
        else:
            result = remote.run(action.cmd, timeout=timeout, check=False)
            action.judge(result.exit_code, result.stdout, result.stderr)


def _push(remote: Connection, action: Push, progress: Callable[[str], None] | None) -> None:
    if action.local.is_dir():
        remote.sync_dir(action.local, action.remote, progress)
    else:
        remote.put_file(action.local, action.remote)


def read(remote: Connection, cmd: Cmd, timeout: float | None = 120.0) -> RunResult:
    """A fact read: never raises for a non-zero exit (the parser decides what it means)."""
    return remote.run(cmd, timeout=timeout, check=False)


def require_ok(result: RunResult, what: str) -> str:
    if result.exit_code != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()
        raise ProvisionError(f"{what} failed (exit {result.exit_code})" + (f": {tail[-1]}" if tail else ""))
    return result.stdout
