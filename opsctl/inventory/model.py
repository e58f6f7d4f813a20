"""Typed, frozen inventory objects. Built only by `opsctl.inventory.load`, which validates everything once.

Field comments are the reference documentation for the YAML keys (docs/inventory.md mirrors them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from opsctl import layout
from opsctl.inventory.monitoring import MonitoringConfig
from opsctl.modes import Mode as Mode  # the table of modes (opsctl.modes); re-exported as the field's type
from opsctl.secrets import SecretRef


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
# The smoke gate's default message: a real chat model answers it in a few tokens. A model trained on one
# domain (the lab's tiny models) is given one of its own prompts instead (`smoke_prompt`).
SMOKE_PROMPT = "What is 2+2? Answer with just the number."


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
class Endpoint:
    """Where to connect: address, port, user (the target or a jump host)."""

    address: str
    port: int
    user: str

    @staticmethod
    def parse_jump(text: str, default_user: str) -> Endpoint:
        """`[user@]host[:port]`."""
        user, _, rest = text.rpartition("@")
        host, sep, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
        if not sep:
            host = rest
        return Endpoint(host, int(port) if port else 22, user or default_user)

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


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


class PolicyMode(StrEnum):
    """`ddtree.policy`: how tree mode picks each round's shape (the runtime's `ddtree.policy`, docs/inventory.md)."""

    OFF = "off"  # always the configured tree
    AUTO = "auto"  # per batch-size bucket: the configured tree, a smaller budget or DFLASH's chain, as measured
    PINNED = "pinned"  # always one shape: `chain` or `tree<N>` (N <= budget)


@dataclass(frozen=True)
class DDTreePolicy:
    mode: PolicyMode = PolicyMode.OFF
    pinned_budget: int | None = None  # PINNED: tree nodes, 0 = the chain

    @property
    def text(self) -> str:
        """The value as written (and as DDTREE_POLICY takes it): off, auto, chain, tree<N>."""
        if self.mode is not PolicyMode.PINNED:
            return self.mode.value
        return "chain" if not self.pinned_budget else f"tree{self.pinned_budget}"


@dataclass(frozen=True)
class DDTreeKnobs:
    budget: int = 32  # tree nodes excluding the root
    topk: int = 8  # candidates per depth
    allow_hybrid_unsafe: bool = False  # permit flat-order tree verify on hybrid targets (inexact; loud)
    log_interval: int = 50  # rounds between DDTREE metrics lines
    selfcheck_every: int = 0  # SGLang tree mode: re-verify every Nth round's paths as chains (0: off)
    round_graphs_max_bs: int | None = None  # SGLang tree mode on CUDA: plan/commit graphs up to this batch size
    policy: DDTreePolicy = field(
        default_factory=lambda: DDTreePolicy()
    )  # tree mode: each round's shape (off: the configured tree)


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
    tp: int = 1  # SGLang tensor-parallel ranks per replica (opsctl.inventory.parallel)
    dp: int = 1  # SGLang data-parallel replicas; tp * dp = len(gpus)
    nccl_port: int | None = None  # rendered --nccl-port (tp > 1, dp 1); None: SGLang picks
    smoke_prompt: str = SMOKE_PROMPT  # the one chat message of the smoke gate (in the model's domain)

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
            and self.mode.spec.verifies_tree
            and self.model.hybrid
            and self.ddtree.allow_hybrid_unsafe
        )

    @property
    def sglang_tree(self) -> bool:
        """SGLang's tree worker verifies trees: what the self-check and the round graphs belong to."""
        return self.engine is Engine.SGLANG and self.mode.spec.verifies_tree

    @property
    def sglang_hybrid_tree(self) -> bool:
        """SGLang tree verify on a hybrid target: exact through SGLang's GDN tree kernels, replayed from the
        target's verify CUDA graphs like DFLASH's (ddtree.sglang.hybrid_graphs; docs/sglang.md)."""
        return self.sglang_tree and self.model.hybrid

    @property
    def sglang_wide_tree(self) -> bool:
        """SGLang tree verify of more nodes than the drafter's block holds: verified in the 2 * block window
        DFLASH reserves, a shape SGLang's verify CUDA graphs are not captured for (docs/sglang.md)."""
        return self.sglang_tree and self.ddtree.budget > SGLANG_DRAFT_BLOCK - 1

    @property
    def sglang_eager_verify(self) -> bool:
        """The unit passes --disable-cuda-graph where SGLang's verify CUDA graphs cannot take a tree: wide trees
        (the plugin refuses them with graphs), and a backend other than triton, the one whose graphs the plugin
        captures reading the tree mask (ddtree.sglang.graph_masks; docs/sglang.md, "CUDA graphs"). Hybrid trees
        keep their graphs: measured exact on the H200 (docs/sglang.md, "Hybrid targets under CUDA graphs")."""
        return self.sglang_wide_tree or (self.sglang_tree and self.attention_backend != "triton")


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
    inventory: str = ""  # the file it was declared in (absolute; "" when built in code): one audit log each

    def service(self, name: str) -> Service:
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(name)


class RouterPolicy(StrEnum):
    """sglang-router's --policy (the names its own CLI takes)."""

    CACHE_AWARE = "cache_aware"  # the router's default: prefix-cache affinity, balanced under load
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    POWER_OF_TWO = "power_of_two"  # two random workers, the less loaded one (reads each worker's /get_load)


@dataclass(frozen=True)
class WorkerRef:
    """One service a router fronts."""

    host: str
    service: str

    def __str__(self) -> str:
        return f"{self.host}/{self.service}"


@dataclass(frozen=True)
class CanaryConfig:
    """`routers.<name>.canary`: `opsctl deploy --canary` moves `workers` of the router's workers to the new
    release, compares them with the rest over `window` seconds of live traffic, then promotes (a rolling deploy
    of the rest) or rolls the canary back (opsctl.rollout.canary; docs/router.md, "Canary")."""

    workers: int = 1  # canary workers (the router keeps at least one worker on the old release)
    window: float = 300.0  # seconds of live traffic compared (a hard failure rolls back sooner)
    max_window: float = 900.0  # too little traffic at `window`: measure on up to this long, then roll back
    min_requests: int = 20  # per group before a verdict; still fewer at `max_window`: rolled back
    max_error_rate: float = 0.01  # canary's aborted + refused requests per request, above the old group's
    max_ttft_ratio: float = 1.5  # canary p95 time to first token / the old group's
    max_itl_ratio: float = 1.5  # canary p95 inter-token latency / the old group's
    min_tok_s_ratio: float = 0.8  # canary decode tok/s (DDTREE metrics) / the old group's
    min_tau_ratio: float = 0.9  # canary tau / the old group's, when both speculate
    max_selfcheck_failures: int = 0  # `DDTREE self-check FAILED` lines of the canary in the window
    max_restarts: int = 0  # NRestarts of a canary unit moved during the window
    replay: int = 3  # on a mode change: greedy requests replayed on both groups, tokens must be equal (0: off)


@dataclass(frozen=True)
class Router:
    """An sglang-router (SGLang's Rust load balancer) in front of services, deployed like a service: unit
    opsctl-router-<name>.service on `host`, releases under /opt/opsctl/services/router-<name>/."""

    name: str
    host: str  # the inventory host it runs on
    port: int  # where clients connect
    workers: tuple[WorkerRef, ...]  # the services it fronts (default: every service of the inventory)
    bind: str = "0.0.0.0"
    policy: RouterPolicy = RouterPolicy.CACHE_AWARE
    version: str = "0.3.2"  # sglang-router pin (locks/sglang-router-<version>.txt)
    api_key: SecretRef | None = None  # clients must send it; the router sends it to the workers too
    max_unavailable: int = 1  # workers of this router out of rotation at once during a rolling deploy
    drain_timeout: float = 60.0  # seconds to wait for a removed worker's in-flight requests
    health_timeout: float = 120.0  # seconds the router's own deploy waits for /health
    readiness_delay: float = 3.0  # seconds before the router's crash-loop re-check
    health_check_interval: int = 2  # seconds between the router's own checks of each worker
    metrics_port: int | None = None  # Prometheus port (default: port + 1)
    canary: CanaryConfig | None = None  # `opsctl deploy --canary` judges against the rest of the fleet

    @property
    def unit_base(self) -> str:
        """The name under /opt/opsctl/services and in the unit (opsctl-<unit_base>.service)."""
        return f"router-{self.name}"

    @property
    def unit_name(self) -> str:
        return layout.unit_name(self.unit_base)

    @property
    def prometheus_port(self) -> int:
        return self.metrics_port if self.metrics_port is not None else self.port + 1


@dataclass(frozen=True)
class Inventory:
    path: str  # the file it was loaded from
    hosts: tuple[Host, ...]
    warnings: tuple[str, ...] = ()  # loud notices (e.g. hybrid unsafe), printed by every command
    routers: tuple[Router, ...] = ()
    # `monitoring:`: thresholds of the alert rules `opsctl monitor render` writes
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)

    def router(self, name: str) -> Router:
        for router in self.routers:
            if router.name == name:
                return router
        raise KeyError(name)

    def routers_of(self, host: str, service: str) -> tuple[Router, ...]:
        """The routers that front host/service."""
        ref = WorkerRef(host, service)
        return tuple(r for r in self.routers if ref in r.workers)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)
