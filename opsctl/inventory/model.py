"""Typed, frozen inventory objects. Built only by `opsctl.inventory.load`, which validates everything once.

Field comments are the reference documentation for the YAML keys (docs/inventory.md mirrors them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from opsctl import layout
from opsctl.secrets import SecretRef


class Mode(StrEnum):
    BASELINE = "baseline"  # no speculation: throughput floor and the greedy reference
    LINEAR = "linear"  # SGLang's built-in DFLASH chain verify
    SHADOW = "shadow"  # DDTREE builds and logs the tree, verifies only the spine
    TREE = "tree"  # DDTREE verifies the whole tree in one forward

    @property
    def speculative(self) -> bool:
        return self is not Mode.BASELINE

    @property
    def ddtree(self) -> bool:
        return self in (Mode.SHADOW, Mode.TREE)


class Engine(StrEnum):
    SGLANG = "sglang"  # production: SGLang server from the host's venv
    REFERENCE = "reference"  # ddtree's own server (python -m ddtree.serve), CPU or GPU


class HostKeyPolicy(StrEnum):
    STRICT = "strict"  # unknown or changed host keys are refused
    ACCEPT_NEW = "accept-new"  # unknown keys are accepted once and recorded; changed keys still refused


class ModelSourceKind(StrEnum):
    CONTROL = "control"  # a path on the machine running opsctl
    HOST = "host"  # a path on the target host (e.g. an NVMe directory)


# DFlash drafters of the Qwen3/3.6 family draft blocks of 16 tokens; the SGLang plugin's tree verify takes
# budgets up to block - 1 with CUDA graphs, up to 2 * block - 1 without (docs/sglang.md).
SGLANG_DRAFT_BLOCK = 16


@dataclass(frozen=True)
class SshConfig:
    user: str = "root"
    port: int = 22
    key_file: str | None = None  # private key path on the control machine; None = ssh-agent/default keys
    known_hosts_file: str = "~/.ssh/known_hosts"
    host_key_policy: HostKeyPolicy = HostKeyPolicy.STRICT
    jump_host: str | None = None  # [user@]host[:port] to hop through
    connect_timeout: float = 10.0  # seconds to establish the TCP+SSH connection
    command_timeout: float = 600.0  # default seconds a remote command may run
    connect_retries: int = 3  # attempts with exponential backoff before "unreachable"
    keepalive: int = 15  # seconds between SSH keepalives


@dataclass(frozen=True)
class CudaConfig:
    toolkit_package: str = "cuda-toolkit-13-0"  # apt package from NVIDIA's CUDA repository
    home: str = "/usr/local/cuda-13.0"  # CUDA_HOME in the units (FlashInfer JIT needs nvcc)
    min_driver: int = 580  # minimum driver major version (CUDA 13 needs 580+)
    driver_package: str = "nvidia-open"  # open kernel modules (required for Blackwell)


@dataclass(frozen=True)
class ModelSpec:
    source: str  # where the weights come from
    source_on: ModelSourceKind  # whether `source` is on the control machine or on the host
    path: str  # destination on the host, under /dev/shm
    hybrid: bool  # recurrent (Gated DeltaNet) + attention layers: tree verify needs exact handling

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class DDTreeKnobs:
    budget: int = 32  # tree nodes excluding the root
    topk: int = 8  # candidates per depth
    allow_hybrid_unsafe: bool = False  # permit flat-order tree verify on hybrid targets (inexact; loud)
    log_interval: int = 50  # rounds between DDTREE metrics lines
    selfcheck_every: int = 0  # SGLang tree mode: re-verify every Nth round's paths as chains (0: off)


@dataclass(frozen=True)
class Service:
    name: str
    host: str  # the host's name
    gpus: tuple[int, ...]  # CUDA_VISIBLE_DEVICES; empty for a CPU reference service
    port: int
    mode: Mode
    engine: Engine
    model: ModelSpec
    draft_model: ModelSpec | None  # required for every mode except baseline
    ddtree: DDTreeKnobs
    bind: str = "0.0.0.0"  # address the server listens on
    served_model_name: str | None = None
    attention_backend: str = "triton"  # sglang engine, speculative modes
    device: str = "cuda"  # reference engine: cpu or cuda
    dtype: str = "auto"
    api_key: SecretRef | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    health_timeout: float = 600.0  # seconds the deploy health gate waits for /health
    readiness_delay: float = 10.0  # seconds between the first healthy answer and the crash-loop re-check

    @property
    def unit_name(self) -> str:
        return layout.unit_name(self.name)

    @property
    def hybrid_unsafe(self) -> bool:
        """True when this service runs tree verify on a hybrid target in flat order: the reference engine does
        that when asked (`allow_hybrid_unsafe`), to measure the error of a naive tree verify. SGLang's tree
        worker is exact on hybrid targets whenever opsctl renders it (CUDA graphs off), so never unsafe."""
        return (
            self.engine is Engine.REFERENCE
            and self.mode is Mode.TREE
            and self.model.hybrid
            and self.ddtree.allow_hybrid_unsafe
        )

    @property
    def sglang_hybrid_tree(self) -> bool:
        """SGLang tree verify on a hybrid target: exact through SGLang's GDN tree kernels, which the verify
        runs eagerly (its CUDA graphs hold chain metadata)."""
        return self.engine is Engine.SGLANG and self.mode is Mode.TREE and self.model.hybrid

    @property
    def sglang_wide_tree(self) -> bool:
        """SGLang tree verify of more nodes than the drafter's block holds: verified in the 2 * block window
        DFLASH reserves, a shape SGLang's verify CUDA graphs are not captured for (docs/sglang.md)."""
        return self.engine is Engine.SGLANG and self.mode is Mode.TREE and self.ddtree.budget > SGLANG_DRAFT_BLOCK - 1

    @property
    def sglang_eager_verify(self) -> bool:
        """The unit passes --disable-cuda-graph: the SGLang plugin refuses hybrid and wide trees with CUDA graphs,
        and dense trees stay eager until graph replay is shown exact: on the H200 a tree verify replayed from
        SGLang's decode CUDA graphs once disagreed with an eager chain re-verify (logit gap 0.35), where eager tree
        verifies agreed 54 of 54 times (docs/sglang.md, "Verified on a GPU")."""
        return self.engine is Engine.SGLANG and self.mode is Mode.TREE


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    ssh: SshConfig
    gpu_count: int  # expected number of GPUs (0 for CPU-only lab hosts)
    venv: str  # path of the shared venv on the host
    python: str  # interpreter used to create the venv
    sglang_version: str  # exact pin
    cuda: CudaConfig | None  # None: no driver/toolkit management (CPU hosts)
    wheelhouse: str | None  # local wheel directory pushed for offline installs
    services: tuple[Service, ...] = field(default=())

    def service(self, name: str) -> Service:
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(name)


@dataclass(frozen=True)
class Inventory:
    path: str  # the file it was loaded from
    hosts: tuple[Host, ...]
    warnings: tuple[str, ...] = ()  # loud notices (e.g. hybrid unsafe), printed by every command

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)
