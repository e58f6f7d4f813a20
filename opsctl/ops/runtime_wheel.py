"""runtime_wheel: make sure each host holds the run's ddtree-runtime wheel at its content-addressed path.

Deploy installs it per release (`pip install --no-deps --target`); provision only pushes it ahead of time. The
wheel, its layout, the check and the push are all `opsctl.artifact`'s (one home for provision and deploy), so
an unchanged runtime/ means the same bytes and no push.
"""

from __future__ import annotations

from opsctl import artifact
from opsctl.ops.base import Context, Plan, Push, execute
from opsctl.wheel import RuntimeWheel

NAME = "runtime_wheel"


def plan_wheel(wheel: RuntimeWheel | None, present: bool) -> Plan:
    if wheel is None:
        return Plan(NAME, notes=("no runtime wheel this run",))
    if present:
        return Plan(NAME, notes=(f"{wheel.remote_path} is current",))
    actions = (artifact.mkdir_cmd(wheel), Push(wheel.path, wheel.remote_path))
    return Plan(NAME, actions=actions, notes=(f"push {wheel.name} (sha256 {wheel.sha256[:12]})",))


class PushRuntimeWheel:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        wheel = ctx.artifacts.runtime_wheel
        return plan_wheel(wheel, wheel is not None and artifact.on_host(ctx.remote, wheel))

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions, progress=ctx.progress)
        return self.plan(ctx)
