"""runtime_wheel: the ddtree-runtime wheel, built once per run on the control machine, pushed to every host.

Deploy installs it per release (`pip install --no-deps --target`); provision only makes sure each host holds
the current build under /opt/opsctl/wheels, content-addressed (`<sha256[:16]>/<wheel>`): wheels of one version
built from different sources (development) never overwrite each other, and a check is stable whatever else
pushed wheels meanwhile. The wheel comes from `opsctl.deploy.wheel.runtime_wheel()` (one builder for
provision and deploy, cached per source hash), so an unchanged runtime/ means the same bytes and no push.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.deploy.wheel import remote_wheel_path
from opsctl.ops.base import Context, Plan, Push, execute, read
from opsctl.ops.facts.manifest import sha256_file

NAME = "runtime_wheel"
remote_path = remote_wheel_path  # one layout for provision and deploy


def plan_wheel(wheel: Path | None, local_sha: str, remote_sha: str | None) -> Plan:
    if wheel is None:
        return Plan(NAME, notes=("no runtime wheel this run",))
    remote = remote_path(wheel.name, local_sha)
    if remote_sha == local_sha:
        return Plan(NAME, notes=(f"{remote} is current",))
    actions = (Cmd.of("mkdir", "-p", posixpath.dirname(remote), sudo=True), Push(wheel, remote))
    return Plan(NAME, actions=actions, notes=(f"push {wheel.name} (sha256 {local_sha[:12]})",))


def parse_sha256sum(exit_code: int, stdout: str) -> str | None:
    if exit_code != 0 or not stdout.strip():
        return None
    digest = stdout.split()[0]
    return digest if len(digest) == 64 else None


class RuntimeWheel:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        wheel = ctx.artifacts.runtime_wheel
        if wheel is None:
            return plan_wheel(None, "", None)
        local_sha = sha256_file(wheel)
        result = read(ctx.remote, Cmd.of("sha256sum", remote_path(wheel.name, local_sha)))
        return plan_wheel(wheel, local_sha, parse_sha256sum(result.exit_code, result.stdout))

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions, progress=ctx.progress)
        return self.plan(ctx)
