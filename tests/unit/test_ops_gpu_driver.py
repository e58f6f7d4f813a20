"""gpu_driver and cuda_toolkit: facts read through a FakeHost from recorded output, exact command plans."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opsctl.commands import Cmd
from opsctl.errors import NoGpuError, ProvisionError
from opsctl.inventory.model import CudaConfig, Host, SshConfig
from opsctl.ops.base import Context, Options, Verify
from opsctl.ops.cuda_toolkit import CudaToolkit
from opsctl.ops.gpu_driver import GpuDriver
from opsctl.remote.fake import FakeHost

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
SMI = "nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader"
PCI = (
    'sh -c \'for d in /sys/bus/pci/devices/*; do [ -r "$d/vendor" ] && echo "$(cat "$d/vendor") '
    '$(cat "$d/class")"; done; true\''
)
PROC = "cat /proc/driver/nvidia/version"
KEYRING_URL = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb"
INSTALL_DRIVER = [
    f"sudo curl -fsSL -o /tmp/cuda-keyring.deb {KEYRING_URL}",
    "sudo dpkg -i /tmp/cuda-keyring.deb",
    "sudo apt-get update",
    "verify nvidia-open candidate >= 580: apt-cache policy -- nvidia-open",
    "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -- nvidia-open",
]


def fx(name: str) -> str:
    return (FACTS / name).read_text()


def host(gpus: int = 8, cuda: CudaConfig | None = None) -> Host:
    return Host("ct200", "10.1.2.200", SshConfig(), gpus, "/opt/opsctl/venv", "python3", "0.5.23", cuda, None)


def fake(smi: tuple[int, str, str], proc: tuple[int, str, str], pci: str) -> FakeHost:
    return FakeHost("ct200", answers={SMI: smi, PROC: proc, PCI: (0, pci, "")}, default=None)


REPO = {
    "cat /etc/os-release": (0, fx("os-release-ubuntu2404.txt"), ""),
    "dpkg --print-architecture": (0, "amd64\n", ""),
    "dpkg-query -W '-f=${Status} ${Version}' cuda-keyring": (1, "", "dpkg-query: no packages found matching"),
    "apt-cache policy -- nvidia-open": (0, fx("apt-cache-policy-nvidia-open-candidate.txt"), ""),
}


def with_repo(h: FakeHost, **overrides: tuple[int, str, str]) -> FakeHost:
    h.answers = {**h.answers, **REPO, **overrides}  # keys are command display forms
    return h


def test_blackwell_host_with_580_open_is_unchanged() -> None:
    remote = fake(
        (0, fx("nvidia-smi-blackwell-8x.txt"), ""),
        (0, fx("proc-nvidia-version-open-580.txt"), ""),
        fx("pci-blackwell-8x.txt"),
    )
    plan = GpuDriver().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.actions == ()
    assert not plan.reboot_required
    assert plan.notes == (
        "8x NVIDIA RTX PRO 6000 Blackwell Server Edition, driver 580.95.05 (open), cc 12.0, 97887 MiB",
    )
    assert remote.ran == [SMI, PROC, PCI]  # no apt facts needed


def test_no_driver_installs_keyring_and_nvidia_open_then_needs_reboot() -> None:
    remote = with_repo(
        fake((127, "", fx("nvidia-smi-not-found.txt")), (1, "", "No such file"), fx("pci-blackwell-8x.txt"))
    )
    plan = GpuDriver().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.commands() == INSTALL_DRIVER
    assert plan.reboot_required
    assert plan.notes[0] == "nvidia-smi: bash: line 1: nvidia-smi: command not found"


def test_old_550_driver_is_upgraded() -> None:
    remote = with_repo(
        fake(
            (0, fx("nvidia-smi-old-550.txt"), ""),
            (0, fx("proc-nvidia-version-proprietary-550.txt"), ""),
            "0x10de 0x030200\n" * 4,
        ),
        **{"dpkg-query -W '-f=${Status} ${Version}' cuda-keyring": (0, "install ok installed 1.1-1", "")},
    )
    plan = GpuDriver().plan(Context(host(gpus=4, cuda=CudaConfig()), remote))
    # keyring already installed: no download
    assert plan.commands() == INSTALL_DRIVER[2:]
    assert "driver 550.127.05 < 580" in plan.notes


def test_blackwell_on_proprietary_modules_switches_to_open() -> None:
    remote = with_repo(
        fake(
            (0, fx("nvidia-smi-blackwell-8x.txt"), ""),
            (0, fx("proc-nvidia-version-proprietary-580-blackwell.txt"), ""),
            fx("pci-blackwell-8x.txt"),
        )
    )
    plan = GpuDriver().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.commands() == INSTALL_DRIVER
    assert "Blackwell GPUs need the open kernel modules" in plan.notes


def test_installed_but_not_loaded_needs_only_a_reboot() -> None:
    remote = with_repo(
        fake((9, "", fx("nvidia-smi-failed.txt")), (1, "", ""), fx("pci-blackwell-8x.txt")),
        **{"apt-cache policy -- nvidia-open": (0, fx("apt-cache-policy-nvidia-open-installed.txt"), "")},
    )
    plan = GpuDriver().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.actions == ()
    assert plan.reboot_required
    assert plan.notes[0].startswith("nvidia-open 580.95.05-0ubuntu1 installed, not loaded: NVIDIA-SMI has failed")


def test_apply_without_reboot_flag_reports_reboot_required_and_never_reboots() -> None:
    remote = with_repo(
        fake((127, "", fx("nvidia-smi-not-found.txt")), (1, "", ""), fx("pci-blackwell-8x.txt")),
    )
    remote.default = (0, "", "")  # the install commands succeed
    op = GpuDriver()
    ctx = Context(host(cuda=CudaConfig()), remote, Options(reboot=False))
    after = op.apply(ctx, op.plan(ctx))
    assert after.reboot_required
    assert "systemctl reboot" not in remote.ran
    assert "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -- nvidia-open" in [
        ("sudo " if c.sudo else "") + c.display() for c in remote.commands
    ]


def test_old_candidate_is_refused_before_installing() -> None:
    remote = with_repo(
        fake((127, "", fx("nvidia-smi-not-found.txt")), (1, "", ""), fx("pci-blackwell-8x.txt")),
        **{"apt-cache policy -- nvidia-open": (0, fx("apt-cache-policy-nvidia-open-old-candidate.txt"), "")},
    )
    remote.default = (0, "", "")
    op = GpuDriver()
    ctx = Context(host(cuda=CudaConfig()), remote)
    plan = op.plan(ctx)
    verify = [a for a in plan.actions if isinstance(a, Verify)]
    assert len(verify) == 1
    with pytest.raises(ProvisionError, match=re.escape("575.57.08-0ubuntu1 is older than 580")):
        op.apply(ctx, plan)
    assert not any("apt-get install" in c for c in remote.ran)


def test_lab_host_without_gpu_says_so_in_one_line() -> None:
    remote = fake((127, "", "sh: 1: nvidia-smi: not found"), (1, "", ""), fx("pci-no-nvidia.txt"))
    plan = GpuDriver().plan(Context(host(gpus=0), remote))
    assert plan.actions == ()
    assert plan.notes == ("no NVIDIA GPU detected",)


def test_require_gpu_fails_without_gpu() -> None:
    remote = fake((127, "", "sh: 1: nvidia-smi: not found"), (1, "", ""), fx("pci-no-nvidia.txt"))
    with pytest.raises(NoGpuError, match="no NVIDIA GPU detected"):
        GpuDriver().plan(Context(host(gpus=0), remote, Options(require_gpu=True)))
    with pytest.raises(NoGpuError, match="expects 8"):
        GpuDriver().plan(Context(host(gpus=8, cuda=CudaConfig()), remote))


def test_gpu_but_no_cuda_section_is_reported_not_managed() -> None:
    remote = fake(
        (0, fx("nvidia-smi-blackwell-8x.txt"), ""),
        (0, fx("proc-nvidia-version-open-580.txt"), ""),
        fx("pci-blackwell-8x.txt"),
    )
    plan = GpuDriver().plan(Context(host(cuda=None), remote))
    assert plan.actions == ()
    assert plan.notes[1] == "driver not managed (the host has no cuda: section)"


NVCC = "/usr/local/cuda-13.0/bin/nvcc --version"


def test_cuda_toolkit_present_is_unchanged() -> None:
    remote = FakeHost("ct200", answers={NVCC: (0, fx("nvcc-13.0.txt"), "")}, default=None)
    plan = CudaToolkit().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.actions == ()
    assert plan.notes == ("nvcc 13.0 at /usr/local/cuda-13.0",)


def test_cuda_toolkit_missing_is_installed_and_verified() -> None:
    remote = FakeHost(
        "ct200",
        answers={
            NVCC: (127, "", "sh: 1: /usr/local/cuda-13.0/bin/nvcc: not found"),
            **REPO,
            "dpkg-query -W '-f=${Status} ${Version}' cuda-keyring": (0, "install ok installed 1.1-1", ""),
            "apt-cache policy -- cuda-toolkit-13-0": (0, fx("apt-cache-policy-cuda-toolkit-13-0.txt"), ""),
        },
        default=None,
    )
    plan = CudaToolkit().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.commands() == [
        "sudo apt-get update",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -- cuda-toolkit-13-0",
        f"verify nvcc release 13.0: {NVCC}",
    ]
    assert plan.notes == ("no nvcc at /usr/local/cuda-13.0, want 13.0 (cuda-toolkit-13-0)",)


def test_cuda_toolkit_wrong_version_after_install_is_an_error() -> None:
    remote = FakeHost(
        "ct200",
        answers={
            NVCC: (0, fx("nvcc-12.4.txt"), ""),
            **REPO,
            "apt-cache policy -- cuda-toolkit-13-0": (0, fx("apt-cache-policy-cuda-toolkit-13-0.txt"), ""),
        },
        default=(0, "", ""),
    )
    op = CudaToolkit()
    ctx = Context(host(cuda=CudaConfig()), remote)
    plan = op.plan(ctx)
    assert plan.notes == ("nvcc 12.4, want 13.0 (cuda-toolkit-13-0)",)
    with pytest.raises(ProvisionError, match=re.escape("reports 12.4 instead of 13.0")):
        op.apply(ctx, plan)


def test_cuda_toolkit_not_managed_without_cuda_section() -> None:
    remote = FakeHost("lab1", default=None)
    plan = CudaToolkit().plan(Context(host(gpus=0), remote))
    assert plan.actions == ()
    assert remote.ran == []


def test_cmd_values_are_exact() -> None:
    # the plan holds Cmd values; sudo is a flag, not text
    remote = with_repo(fake((127, "", fx("nvidia-smi-not-found.txt")), (1, "", ""), fx("pci-blackwell-8x.txt")))
    plan = GpuDriver().plan(Context(host(cuda=CudaConfig()), remote))
    assert plan.actions[1] == Cmd.of("dpkg", "-i", "/tmp/cuda-keyring.deb", sudo=True)


def test_reboot_waits_for_a_new_boot_id() -> None:
    from opsctl.errors import UnreachableError
    from opsctl.ops import reboot

    answers = iter([(0, "boot-1\n", ""), UnreachableError("ct200", "connection refused"), (0, "boot-1\n", ""),
                    (0, "boot-2\n", "")])  # fmt: skip

    def handler(cmd: Cmd) -> tuple[int, str, str] | UnreachableError | None:
        if cmd.display() == "cat /proc/sys/kernel/random/boot_id":
            return next(answers)
        return None

    remote = FakeHost("ct200", handler=handler)
    reboot.reboot_and_wait(remote, timeout=10.0, poll=0.0)
    assert remote.ran.count("cat /proc/sys/kernel/random/boot_id") == 4
    assert "systemctl reboot" in remote.ran
    assert remote.commands[1].sudo


def test_reboot_gives_up_after_the_timeout() -> None:
    from opsctl.ops import reboot

    remote = FakeHost("ct200", answers={"cat /proc/sys/kernel/random/boot_id": (0, "same\n", "")})
    with pytest.raises(ProvisionError, match="not back over SSH"):
        reboot.reboot_and_wait(remote, timeout=0.05, poll=0.01)


def test_apply_with_reboot_flag_reboots_and_rechecks(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsctl.ops import reboot

    remote = with_repo(
        fake((127, "", fx("nvidia-smi-not-found.txt")), (1, "", ""), fx("pci-blackwell-8x.txt")),
    )
    remote.default = (0, "", "")
    rebooted: list[str] = []

    def fake_reboot(r: FakeHost, timeout: float) -> None:
        rebooted.append(r.name)
        # after the reboot the open driver answers
        r.answers = {
            **r.answers,
            SMI: (0, fx("nvidia-smi-blackwell-8x.txt"), ""),
            PROC: (0, fx("proc-nvidia-version-open-580.txt"), ""),
        }

    monkeypatch.setattr(reboot, "reboot_and_wait", fake_reboot)
    op = GpuDriver()
    ctx = Context(host(cuda=CudaConfig()), remote, Options(reboot=True))
    after = op.apply(ctx, op.plan(ctx))
    assert rebooted == ["ct200"]
    assert not after.reboot_required and after.actions == ()
