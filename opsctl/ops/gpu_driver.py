"""gpu_driver: an NVIDIA driver new enough for the CUDA release, with open kernel modules on Blackwell.

Installed from NVIDIA's CUDA apt repository through the cuda-keyring package. A driver install needs a reboot;
it is never done silently: the step reports reboot_required (exit 3) unless --reboot was given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opsctl.commands import Cmd
from opsctl.errors import NoGpuError, ProvisionError
from opsctl.facts.apt import (
    AptPolicy,
    OsRelease,
    parse_apt_policy,
    parse_dpkg_status,
    parse_os_release,
    upstream_major,
)
from opsctl.facts.nvidia import (
    NVIDIA_SMI_QUERY,
    KernelModule,
    SmiFacts,
    SmiState,
    driver_major,
    parse_nvidia_smi,
    parse_pci_vendors,
    parse_proc_version,
)
from opsctl.inventory.model import CudaConfig
from opsctl.ops import reboot
from opsctl.ops.base import Action, Context, Options, Plan, Verify, execute, read
from opsctl.remote.base import Connection

NAME = "gpu_driver"
KEYRING_VERSION = "1.1-1"
KEYRING_DEB = "/tmp/cuda-keyring.deb"
_DPKG_FORMAT = "${Status} ${Version}"
_PCI_LIST = (
    'for d in /sys/bus/pci/devices/*; do [ -r "$d/vendor" ] && echo "$(cat "$d/vendor") $(cat "$d/class")"; done; true'
)
_CUDA_ARCH = {"amd64": "x86_64", "arm64": "sbsa"}


@dataclass(frozen=True)
class RepoFacts:
    """What apt knows; read only when an install is on the table."""

    os: OsRelease
    dpkg_arch: str  # amd64, arm64
    keyring: str | None  # installed cuda-keyring version
    driver: AptPolicy  # the driver meta package (nvidia-open)


@dataclass(frozen=True)
class DriverFacts:
    smi: SmiFacts
    module: KernelModule | None
    pci_gpus: int  # NVIDIA display/3D controllers on the PCI bus
    repo: RepoFacts | None = None

    @property
    def gpu_present(self) -> bool:
        return self.pci_gpus > 0 or bool(self.smi.gpus)


def keyring_url(os: OsRelease, dpkg_arch: str) -> str:
    arch = _CUDA_ARCH.get(dpkg_arch)
    if arch is None:
        raise ProvisionError(f"no NVIDIA CUDA repository for architecture {dpkg_arch}")
    return (
        f"https://developer.download.nvidia.com/compute/cuda/repos/{os.cuda_repo}/{arch}/"
        f"cuda-keyring_{KEYRING_VERSION}_all.deb"
    )


def repo_actions(repo: RepoFacts) -> list[Action]:
    """Add NVIDIA's CUDA apt repository (when missing) and refresh the package lists."""
    actions: list[Action] = []
    if repo.keyring is None:
        actions += [
            Cmd.of("curl", "-fsSL", "-o", KEYRING_DEB, keyring_url(repo.os, repo.dpkg_arch), sudo=True),
            Cmd.of("dpkg", "-i", KEYRING_DEB, sudo=True),
        ]
    actions.append(Cmd.of("apt-get", "update", sudo=True))
    return actions


def apt_install(*packages: str) -> Cmd:
    return Cmd.of("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--", *packages, sudo=True)


def describe(facts: DriverFacts) -> str:
    gpus = facts.smi.gpus
    first = gpus[0]
    kind = "open" if facts.module is not None and facts.module.open else "proprietary"
    cap = f"{first.compute_cap[0]}.{first.compute_cap[1]}"
    return f"{len(gpus)}x {first.name}, driver {first.driver_version} ({kind}), cc {cap}, {first.memory_mib} MiB"


def plan_driver(facts: DriverFacts, cuda: CudaConfig | None, expected_gpus: int, options: Options) -> Plan:
    """The pure decision: what to do given the facts."""
    if not facts.gpu_present:
        if options.require_gpu or expected_gpus > 0:
            raise NoGpuError(
                f"no NVIDIA GPU detected (the inventory expects {expected_gpus})",
                "check the host's hardware, or set gpu_count: 0 for a CPU host",
            )
        return Plan(NAME, notes=("no NVIDIA GPU detected",))
    if cuda is None:
        note = describe(facts) if facts.smi.state is SmiState.OK else f"nvidia-smi: {facts.smi.detail}"
        return Plan(NAME, notes=(note, "driver not managed (the host has no cuda: section)"))
    if facts.smi.state is SmiState.OK:
        gpu = facts.smi.gpus[0]
        major = driver_major(gpu.driver_version)
        needs_open = gpu.blackwell and not (facts.module is not None and facts.module.open)
        notes = [describe(facts)]
        if expected_gpus and len(facts.smi.gpus) < expected_gpus:
            notes.append(f"only {len(facts.smi.gpus)} of {expected_gpus} expected GPUs visible")
        if major >= cuda.min_driver and not needs_open:
            return Plan(NAME, notes=tuple(notes))
        reason = (
            f"driver {gpu.driver_version} < {cuda.min_driver}"
            if major < cuda.min_driver
            else "Blackwell GPUs need the open kernel modules"
        )
        return _install_plan(facts, cuda, (*notes, reason))
    # A GPU is present but the driver does not answer: not installed, or installed and not yet loaded.
    installed = facts.repo.driver.installed if facts.repo is not None else None
    if installed is not None and upstream_major(installed) >= cuda.min_driver:
        return Plan(
            NAME,
            notes=(f"{cuda.driver_package} {installed} installed, not loaded: {facts.smi.detail}",),
            reboot_required=True,
        )
    return _install_plan(facts, cuda, (f"nvidia-smi: {facts.smi.detail or facts.smi.state.value}",))


def _install_plan(facts: DriverFacts, cuda: CudaConfig, notes: tuple[str, ...]) -> Plan:
    if facts.repo is None:
        raise ProvisionError("apt facts were not read before planning a driver install")
    actions = repo_actions(facts.repo)
    # Refuse before installing when the repository's candidate is too old for this CUDA release.
    actions.append(
        Verify(
            Cmd.of("apt-cache", "policy", "--", cuda.driver_package),
            judge=_candidate_judge(cuda.driver_package, cuda.min_driver),
            what=f"{cuda.driver_package} candidate >= {cuda.min_driver}",
        )
    )
    actions.append(apt_install(cuda.driver_package))
    return Plan(NAME, actions=tuple(actions), notes=(*notes, "a reboot follows the install"), reboot_required=True)


def _candidate_judge(package: str, minimum: int) -> Callable[[int, str, str], None]:
    def judge(exit_code: int, stdout: str, stderr: str) -> None:
        policy = parse_apt_policy(package, stdout)
        if policy.candidate is None:
            raise ProvisionError(f"apt has no candidate for {package}", "check the CUDA repository (cuda-keyring)")
        if upstream_major(policy.candidate) < minimum:
            raise ProvisionError(f"apt candidate {package} {policy.candidate} is older than {minimum}")

    return judge


def read_facts(remote: Connection, cuda: CudaConfig | None) -> DriverFacts:
    smi_result = read(remote, Cmd.of(*NVIDIA_SMI_QUERY))
    smi = parse_nvidia_smi(smi_result.exit_code, smi_result.stdout, smi_result.stderr)
    proc = read(remote, Cmd.of("cat", "/proc/driver/nvidia/version"))
    module = parse_proc_version(proc.exit_code, proc.stdout)
    pci = parse_pci_vendors(read(remote, Cmd.of("sh", "-c", _PCI_LIST)).stdout)
    facts = DriverFacts(smi, module, pci)
    if cuda is None or not facts.gpu_present or (smi.state is SmiState.OK and _driver_ok(facts, cuda)):
        return facts
    return DriverFacts(smi, module, pci, read_repo_facts(remote, cuda.driver_package))


def _driver_ok(facts: DriverFacts, cuda: CudaConfig) -> bool:
    gpu = facts.smi.gpus[0]
    open_ok = not gpu.blackwell or (facts.module is not None and facts.module.open)
    return driver_major(gpu.driver_version) >= cuda.min_driver and open_ok


def read_repo_facts(remote: Connection, package: str) -> RepoFacts:
    os_release = parse_os_release(read(remote, Cmd.of("cat", "/etc/os-release")).stdout)
    arch = read(remote, Cmd.of("dpkg", "--print-architecture")).stdout.strip()
    keyring = read(remote, Cmd.of("dpkg-query", "-W", f"-f={_DPKG_FORMAT}", "cuda-keyring"))
    policy = read(remote, Cmd.of("apt-cache", "policy", "--", package))
    return RepoFacts(
        os_release,
        arch,
        parse_dpkg_status(keyring.exit_code, keyring.stdout),
        parse_apt_policy(package, policy.stdout),
    )


class GpuDriver:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        facts = read_facts(ctx.remote, ctx.spec.cuda)
        return plan_driver(facts, ctx.spec.cuda, ctx.spec.gpu_count, ctx.options)

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions, timeout=1800.0, progress=ctx.progress)
        if not plan.reboot_required:
            return self.plan(ctx)
        if not ctx.options.reboot:
            return Plan(
                NAME, notes=("reboot required: rerun with --reboot, or reboot and rerun",), reboot_required=True
            )
        reboot.reboot_and_wait(ctx.remote, ctx.options.reboot_timeout)
        after = self.plan(ctx)
        if after.changes or after.reboot_required:
            raise ProvisionError(
                f"{ctx.spec.name}: the driver is still not usable after a reboot ({'; '.join(after.notes)})",
                "check `nvidia-smi` and `dmesg | grep -i nvidia` on the host",
            )
        return after
