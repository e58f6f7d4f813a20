"""Fact parsers on recorded command output (tests/fixtures/facts), malformed output included."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.errors import FactError
from opsctl.facts.apt import (
    AptPolicy,
    parse_apt_policy,
    parse_dpkg_status,
    parse_os_release,
    upstream_major,
)
from opsctl.facts.cuda import parse_nvcc_version, toolkit_version
from opsctl.facts.manifest import FileEntry, Manifest, compare, parse_hash_listing, parse_manifest_json
from opsctl.facts.nvidia import (
    Gpu,
    KernelModule,
    SmiState,
    parse_nvidia_smi,
    parse_pci_vendors,
    parse_proc_version,
)
from opsctl.facts.system import parse_df, parse_python_version

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def fx(name: str) -> str:
    return (FACTS / name).read_text()


def test_nvidia_smi_blackwell_host() -> None:
    facts = parse_nvidia_smi(0, fx("nvidia-smi-blackwell-8x.txt"), "")
    assert facts.state is SmiState.OK
    assert len(facts.gpus) == 8
    assert facts.gpus[0] == Gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", "580.95.05", (12, 0), 97887)
    assert all(g.blackwell for g in facts.gpus)


def test_nvidia_smi_old_driver_is_not_blackwell() -> None:
    facts = parse_nvidia_smi(0, fx("nvidia-smi-old-550.txt"), "")
    assert [g.driver_version for g in facts.gpus] == ["550.127.05"] * 4
    assert facts.gpus[0].compute_cap == (9, 0)
    assert not facts.gpus[0].blackwell


@pytest.mark.parametrize(
    ("exit_code", "fixture", "state"),
    [
        (127, "nvidia-smi-not-found.txt", SmiState.MISSING),
        (9, "nvidia-smi-failed.txt", SmiState.NO_DRIVER),
        (18, "nvidia-smi-mismatch.txt", SmiState.MISMATCH),
    ],
)
def test_nvidia_smi_failures(exit_code: int, fixture: str, state: SmiState) -> None:
    facts = parse_nvidia_smi(exit_code, "", fx(fixture))
    assert facts.state is state
    assert facts.gpus == ()
    assert facts.detail == fx(fixture).splitlines()[0]


def test_nvidia_smi_sh_not_found_message() -> None:
    assert parse_nvidia_smi(127, "", "sh: 1: nvidia-smi: not found\n").state is SmiState.MISSING


@pytest.mark.parametrize("fixture", ["nvidia-smi-malformed-cap.txt", "nvidia-smi-malformed-fields.txt"])
def test_nvidia_smi_malformed(fixture: str) -> None:
    with pytest.raises(FactError, match="nvidia-smi"):
        parse_nvidia_smi(0, fx(fixture), "")


def test_proc_version_open_and_proprietary() -> None:
    assert parse_proc_version(0, fx("proc-nvidia-version-open-580.txt")) == KernelModule("580.95.05", True)
    assert parse_proc_version(0, fx("proc-nvidia-version-proprietary-550.txt")) == KernelModule("550.127.05", False)
    assert parse_proc_version(1, "cat: /proc/driver/nvidia/version: No such file or directory") is None


def test_proc_version_malformed() -> None:
    with pytest.raises(FactError, match="NVRM version"):
        parse_proc_version(0, fx("proc-nvidia-version-malformed.txt"))


def test_pci_vendor_count() -> None:
    # 8 NVIDIA 3D controllers; the NVIDIA audio function (0x0403) and other vendors do not count
    assert parse_pci_vendors(fx("pci-blackwell-8x.txt")) == 8
    assert parse_pci_vendors(fx("pci-no-nvidia.txt")) == 0
    assert parse_pci_vendors("") == 0


def test_nvcc_versions() -> None:
    assert parse_nvcc_version(0, fx("nvcc-13.0.txt")) == "13.0"
    assert parse_nvcc_version(0, fx("nvcc-12.4.txt")) == "12.4"
    assert parse_nvcc_version(127, "") is None
    with pytest.raises(FactError, match="release"):
        parse_nvcc_version(0, fx("nvcc-malformed.txt"))


def test_toolkit_version_from_package() -> None:
    assert toolkit_version("cuda-toolkit-13-0") == "13.0"
    with pytest.raises(FactError, match="cuda-toolkit-MAJOR-MINOR"):
        toolkit_version("cuda-13")


def test_apt_policy() -> None:
    assert parse_apt_policy("nvidia-open", fx("apt-cache-policy-nvidia-open-candidate.txt")) == AptPolicy(
        "nvidia-open", None, "580.95.05-0ubuntu1"
    )
    assert parse_apt_policy("nvidia-open", fx("apt-cache-policy-nvidia-open-installed.txt")) == AptPolicy(
        "nvidia-open", "580.95.05-0ubuntu1", "580.95.05-0ubuntu1"
    )
    assert parse_apt_policy("cuda-toolkit-13-0", fx("apt-cache-policy-cuda-toolkit-13-0.txt")).candidate == "13.0.2-1"
    assert parse_apt_policy("nvidia-open", fx("apt-cache-policy-unknown.txt")) == AptPolicy("nvidia-open", None, None)
    assert parse_apt_policy("nvidia-open", "") == AptPolicy("nvidia-open", None, None)


def test_apt_policy_malformed() -> None:
    with pytest.raises(FactError, match="Candidate"):
        parse_apt_policy("nvidia-open", fx("apt-cache-policy-malformed.txt"))
    with pytest.raises(FactError, match="header"):
        parse_apt_policy("nvidia-open", fx("apt-cache-policy-cuda-toolkit-13-0.txt"))


def test_dpkg_status_and_versions() -> None:
    assert parse_dpkg_status(0, "install ok installed 1.1-1") == "1.1-1"
    assert parse_dpkg_status(1, "dpkg-query: no packages found matching cuda-keyring") is None
    assert parse_dpkg_status(0, "deinstall ok config-files 1.1-1") is None
    with pytest.raises(FactError):
        parse_dpkg_status(0, "garbage")
    assert upstream_major("580.95.05-0ubuntu1") == 580
    assert upstream_major("1:13.0.2-1") == 13


def test_os_release() -> None:
    os_release = parse_os_release(fx("os-release-ubuntu2404.txt"))
    assert os_release.cuda_repo == "ubuntu2404"
    with pytest.raises(FactError):
        parse_os_release("NAME=x\n")


def test_df() -> None:
    space = parse_df(fx("df-dev-shm.txt"))
    assert (space.mount, space.size, space.used, space.available) == ("/dev/shm", 25769803776, 0, 25769803776)
    assert parse_df(fx("df-dev-shm-small.txt")).available == 4194304
    with pytest.raises(FactError, match="-B1"):
        parse_df(fx("df-malformed.txt"))
    with pytest.raises(FactError):
        parse_df("")


def test_python_version() -> None:
    assert parse_python_version(0, fx("python-3.11.txt")) == (3, 11, 2)
    assert parse_python_version(0, fx("python-3.10.txt")) == (3, 10, 12)
    assert parse_python_version(127, "") is None
    with pytest.raises(FactError):
        parse_python_version(0, "Python three")


def test_hash_listing_and_compare() -> None:
    a, b = "a" * 64, "b" * 64
    listing = parse_hash_listing(f"{a} 10 config.json\n{b} 20 dir/model weights.safetensors\n")
    assert listing == {"config.json": FileEntry(10, a), "dir/model weights.safetensors": FileEntry(20, b)}
    manifest = Manifest({"config.json": FileEntry(10, a), "tok.json": FileEntry(5, b)})
    state = compare(manifest, {"config.json": FileEntry(10, b), "extra.bin": FileEntry(1, a)})
    assert (state.good, state.bad, state.missing, state.extra) == (
        frozenset(),
        frozenset({"config.json"}),
        frozenset({"tok.json"}),
        frozenset({"extra.bin"}),
    )
    assert not state.matches
    assert compare(manifest, dict(manifest.files)).matches
    with pytest.raises(FactError, match="malformed"):
        parse_hash_listing("deadbeef 10 x\n")


def test_manifest_json_round_trip() -> None:
    manifest = Manifest({"b.bin": FileEntry(3, "c" * 64), "a.json": FileEntry(2, "d" * 64)})
    assert parse_manifest_json(manifest.to_json()) == manifest
    assert parse_manifest_json("") is None
    assert parse_manifest_json("{not json") is None
    assert parse_manifest_json('{"files": {"x": {"size": 1}}}') is None


def test_sizes_keep_a_readable_unit() -> None:
    """A model of 1.8 MB read `0.00 GiB`."""
    from opsctl.facts.system import size_iec

    assert size_iec(1_800_000) == "1.7 MiB"
    assert size_iec(2 * 2**30) == "2.00 GiB"
    assert size_iec(1100) == "1.1 KiB"
    assert (size_iec(512), size_iec(0)) == ("512 B", "0 B")
