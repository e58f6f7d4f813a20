"""The release corridor shared by services and routers: the commands that put a release live, that restore
an older one after a failure, and that take away a first release that failed, as values.

`--plan` prints these exact steps and the deploys run them (`run_steps`), so the service's and the router's
sides cannot drift apart again (the router's used to restore without `reset-failed`). Pure but `run_steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opsctl import systemd
from opsctl.commands import Cmd
from opsctl.deploy import release
from opsctl.deploy.release import ServicePaths


@dataclass(frozen=True)
class Step:
    cmd: Cmd
    check: bool = True  # False: its failure does not stop the corridor (enable, the cleanup of a teardown)

    def display(self) -> str:
        return self.cmd.display() + ("" if self.check else "  (may fail)")


def go_live(paths: ServicePaths, release_id: str) -> tuple[Step, ...]:
    """Switch `current` atomically, install the release's unit, reload, enable, restart."""
    return (
        Step(release.switch_cmd(paths, release_id)),
        Step(release.install_unit_cmd(paths, release_id)),
        Step(systemd.daemon_reload_cmd()),
        Step(systemd.enable_cmd(paths.unit_name), check=False),
        Step(systemd.restart_cmd(paths.unit_name)),
    )


def restore(paths: ServicePaths, release_id: str) -> tuple[Step, ...]:
    """Back to a release that served before: the failed one's crash loop is forgotten first (NRestarts and a
    `failed` state would otherwise fail the restored release's gate, and StartLimitBurst could refuse it)."""
    return (Step(systemd.reset_failed_cmd(paths.unit_name), check=False), *go_live(paths, release_id))


def teardown(paths: ServicePaths) -> tuple[Step, ...]:
    """A first release failed with nothing to go back to: stop the unit, remove what the deploy installed."""
    return (
        Step(systemd.disable_now_cmd(paths.unit_name), check=False),
        Step(Cmd.of("rm", "-f", "--", paths.current, paths.installed_unit, sudo=True), check=False),
        Step(systemd.daemon_reload_cmd(), check=False),
        Step(systemd.reset_failed_cmd(paths.unit_name), check=False),
    )


def run_steps(run: Callable[[Cmd, bool], object], steps: Sequence[Step]) -> None:
    """Each step in order through `run(cmd, check)`; a checked step that fails raises (the caller's error)."""
    for step in steps:
        run(step.cmd, step.check)


def plan_lines(steps: Sequence[Step]) -> list[str]:
    return ["  $ " + step.display() for step in steps]
