"""cuda_toolkit: the inventory's CUDA toolkit package (e.g. cuda-toolkit-13-0), verified with `nvcc --version`.

FlashInfer compiles kernels at run time with nvcc, so the units get CUDA_HOME and PATH from the inventory's
`cuda.home` (rendered by opsctl.render); this step makes sure that nvcc exists there.
"""

from __future__ import annotations

from collections.abc import Callable

from opsctl.commands import Cmd
from opsctl.errors import ProvisionError
from opsctl.facts.cuda import parse_nvcc_version, toolkit_version
from opsctl.inventory.model import CudaConfig
from opsctl.ops.base import Context, Plan, Verify, execute, read
from opsctl.ops.gpu_driver import RepoFacts, apt_install, read_repo_facts, repo_actions
from opsctl.remote.base import Connection

NAME = "cuda_toolkit"


def nvcc_cmd(cuda: CudaConfig) -> Cmd:
    return Cmd.of(f"{cuda.home.rstrip('/')}/bin/nvcc", "--version")


def plan_toolkit(cuda: CudaConfig | None, nvcc: str | None, repo: RepoFacts | None) -> Plan:
    if cuda is None:
        return Plan(NAME, notes=("CUDA toolkit not managed (the host has no cuda: section)",))
    want = toolkit_version(cuda.toolkit_package)
    if nvcc == want:
        return Plan(NAME, notes=(f"nvcc {nvcc} at {cuda.home}",))
    if repo is None:
        raise ProvisionError("apt facts were not read before planning a toolkit install")
    found = f"nvcc {nvcc}" if nvcc else f"no nvcc at {cuda.home}"
    actions = [
        *repo_actions(repo),
        apt_install(cuda.toolkit_package),
        Verify(nvcc_cmd(cuda), judge=_nvcc_judge(want, cuda.home), what=f"nvcc release {want}"),
    ]
    return Plan(NAME, actions=tuple(actions), notes=(f"{found}, want {want} ({cuda.toolkit_package})",))


def _nvcc_judge(want: str, home: str) -> Callable[[int, str, str], None]:
    def judge(exit_code: int, stdout: str, stderr: str) -> None:
        got = parse_nvcc_version(exit_code, stdout)
        if got != want:
            raise ProvisionError(
                f"after the install, {home}/bin/nvcc reports {got or 'nothing'} instead of {want}",
                "check cuda.home and cuda.toolkit_package in the inventory",
            )

    return judge


def read_nvcc(remote: Connection, cuda: CudaConfig) -> str | None:
    result = read(remote, nvcc_cmd(cuda))
    return parse_nvcc_version(result.exit_code, result.stdout)


class CudaToolkit:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        cuda = ctx.spec.cuda
        if cuda is None:
            return plan_toolkit(None, None, None)
        nvcc = read_nvcc(ctx.remote, cuda)
        repo = None
        if nvcc != toolkit_version(cuda.toolkit_package):
            repo = read_repo_facts(ctx.remote, cuda.toolkit_package)
        return plan_toolkit(cuda, nvcc, repo)

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions, timeout=3600.0, progress=ctx.progress)
        return self.plan(ctx)
