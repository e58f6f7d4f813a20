"""DDTree knobs. SGLang plugins cannot add CLI flags, so every knob comes from the environment.

| variable                    | values          | default | meaning                                             |
| --------------------------- | --------------- | ------- | --------------------------------------------------- |
| DDTREE_VERIFY               | shadow, tree    | tree    | verify the spine only (shadow) or the whole tree    |
| DDTREE_BUDGET               | int >= 1        | 32      | tree nodes excluding the root                       |
| DDTREE_TOPK                 | int >= 1        | 8       | candidate tokens per depth                          |
| DDTREE_ALLOW_HYBRID_UNSAFE  | 0, 1            | 0       | allow flat-order tree verify on a hybrid target     |
| DDTREE_LOG_INTERVAL         | int >= 1        | 50      | rounds between `DDTREE metrics` lines               |
| DDTREE_SELFCHECK_EVERY      | int >= 0        | 0 (off) | SGLang tree verify: every Nth round, re-verify the  |
|                             |                 |         | accepted paths as chains; a mismatch is an ERROR    |
|                             |                 |         | and the process falls back to DFLASH's rounds       |
| DDTREE_ROUND_GRAPHS_MAX_BS  | int >= 0        | 8       | SGLang tree verify on CUDA: batches up to this size |
|                             |                 |         | replay the tree plan + commit from CUDA graphs      |
|                             |                 |         | (0: always eager)                                   |
| DDTREE_POLICY               | off, auto,      | off     | tree verify: per round, the configured tree (off),  |
|                             | chain, tree<N>  |         | the shape `ddtree.policy` estimates best (auto), or |
|                             |                 |         | one pinned shape (N <= DDTREE_BUDGET)               |
| DDTREE_FUSED_BUILD          | 0, 1            | (unset) | the tree planner: unset, the Triton one on CUDA and |
|                             |                 |         | the torch one on a CPU; 0, torch everywhere (a kill |
|                             |                 |         | switch); 1, Triton on a CPU too, under Triton's     |
|                             |                 |         | interpreter (TRITON_INTERPRET=1: parity tests)      |
| DDTREE_REPLAY_ACCEPTANCE    | a paths file    | (unset) | BENCHMARKS ONLY: the SGLang tree worker commits the |
|                             |                 |         | recorded paths instead of the target's choices      |
|                             |                 |         | (`ddtree.sglang.replay`); opsctl refuses to render  |
| DDTREE_RECORD_PATHS         | a file to write | (unset) | BENCHMARKS ONLY: the SGLang tree worker writes each |
|                             |                 |         | request's accepted paths there (a paths file, the   |
|                             |                 |         | replay's input; a sync per round); opsctl refuses   |
| DDTREE_RECORD_ROUNDS        | a file to write | (unset) | BENCHMARKS ONLY: the tree worker's shape policy     |
|                             |                 |         | appends every round report it is fed there          |
|                             |                 |         | (`ddtree.sglang.policy_glue`); opsctl refuses       |
| DDTREE_TEST_POLICY          | phased          | (unset) | TESTS ONLY: the shape policy switches fast on       |
|                             |                 |         | synthetic costs (`ddtree.sglang.policy_glue`);      |
|                             |                 |         | opsctl refuses                                      |
| DDTREE_TEST_DEMOTE_SPINE    | 0, 1            | 0       | TESTS ONLY: the SGLang tree worker plans from       |
|                             |                 |         | scores with the drafter's first two choices at the  |
|                             |                 |         | first depth swapped, so its tree accepts off the    |
|                             |                 |         | spine whenever the drafter's first choice was right |
|                             |                 |         | (`ddtree.sglang.bench_hooks`); opsctl refuses       |

An unset or empty variable takes its default (a systemd EnvironmentFile may write `KEY=`). A process reads its
environment once (`process_config`, `triton_interpreted`); nothing on a round's path reads it again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache

from ddtree.modes import Mode, tree_modes
from ddtree.policy import PolicySetting


class HybridMode(StrEnum):
    """How a tree verify treats recurrent (Gated DeltaNet) layers; printed as `hybrid=` in DDTREE init."""

    EXACT = "exact"  # every node starts from its parent's recurrent state and its ancestors' conv window
    UNSAFE = "unsafe"  # flat node order: siblings leak state; explicitly allowed, loud everywhere
    NONE = "none"  # the target has no recurrent layers


class FusedBuild(StrEnum):
    """Which tree planner `ddtree.fused_tree.fused_available` picks (DDTREE_FUSED_BUILD)."""

    AUTO = "auto"  # the Triton planner on CUDA, the torch one on a CPU
    OFF = "0"  # the torch planner everywhere
    ON = "1"  # the Triton planner on a CPU too, under Triton's interpreter


TEST_POLICIES = ("", "phased")  # DDTREE_TEST_POLICY: unset, or the shape policy on synthetic costs


@dataclass(frozen=True)
class DDTreeConfig:
    verify: Mode = Mode.TREE  # one of the modes that build trees (ddtree.modes.tree_modes)
    budget: int = 32
    topk: int = 8
    allow_hybrid_unsafe: bool = False
    log_interval: int = 50
    selfcheck_every: int = 0  # 0: off
    round_graphs_max_bs: int = 8  # 0: off
    policy: PolicySetting = field(default_factory=PolicySetting)  # off: always the configured tree
    replay_acceptance: str = ""  # a benchmark's paths file (ddtree.sglang.replay); "" in production
    record_paths: str = ""  # a recording run's paths file: paths, trees' top-k (ddtree.sglang.replay); "" in production
    record_rounds: str = ""  # a file the shape policy's round reports are appended to (policy_glue); "" in production
    test_policy: str = ""  # "phased": the shape policy on synthetic costs (policy_glue); "" in production
    test_demote_spine: bool = False  # the drafter's top two swapped at depth 1 (bench_hooks); False in production
    fused_build: FusedBuild = FusedBuild.AUTO

    def __post_init__(self) -> None:
        for name in ("budget", "topk", "log_interval", "selfcheck_every", "round_graphs_max_bs"):
            value = getattr(self, name)
            least = 0 if name in ("selfcheck_every", "round_graphs_max_bs") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"DDTreeConfig.{name} must be an int >= {least}, got {value!r}")
        if not isinstance(self.verify, Mode) or self.verify not in tree_modes():
            object.__setattr__(self, "verify", _parse_verify("DDTreeConfig.verify", str(self.verify)))
        if not isinstance(self.fused_build, FusedBuild):
            object.__setattr__(self, "fused_build", _parse_fused("DDTreeConfig.fused_build", str(self.fused_build)))
        if not isinstance(self.policy, PolicySetting):
            object.__setattr__(self, "policy", _parse_policy("DDTreeConfig.policy", str(self.policy), self.budget))
        if self.test_policy not in TEST_POLICIES:
            raise ValueError(f"DDTREE_TEST_POLICY={self.test_policy!r}: expected phased (or unset)")
        pin = self.policy.pinned
        if pin is not None and pin.budget > self.budget:
            raise ValueError(f"DDTreeConfig.policy={pin.label}: a pinned tree needs budget <= {self.budget}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DDTreeConfig:
        """Read the DDTREE_* variables; a bad value raises ValueError with a one-line message."""

        def get(key: str) -> str | None:
            raw = environ.get(key)
            return None if raw is None or not raw.strip() else raw.strip()

        defaults = cls()
        verify = get("DDTREE_VERIFY")
        unsafe = get("DDTREE_ALLOW_HYBRID_UNSAFE")
        budget = _parse_int("DDTREE_BUDGET", get("DDTREE_BUDGET"), defaults.budget)
        policy = get("DDTREE_POLICY")
        demote = _parse_flag("DDTREE_TEST_DEMOTE_SPINE", get("DDTREE_TEST_DEMOTE_SPINE") or "0")
        benchmark = [k for k in ("DDTREE_REPLAY_ACCEPTANCE", "DDTREE_RECORD_PATHS") if get(k)]
        if demote and benchmark:
            # the demotion replaces the benchmark hooks (bench_hooks.RoundHooks.build): a replay or a recording
            # would silently not happen, and its numbers would describe a drafter nobody runs
            raise ValueError(f"DDTREE_TEST_DEMOTE_SPINE=1 cannot be combined with {benchmark[0]}: unset one of them")
        return cls(
            verify=defaults.verify if verify is None else _parse_verify("DDTREE_VERIFY", verify),
            budget=budget,
            topk=_parse_int("DDTREE_TOPK", get("DDTREE_TOPK"), defaults.topk),
            allow_hybrid_unsafe=defaults.allow_hybrid_unsafe
            if unsafe is None
            else _parse_flag("DDTREE_ALLOW_HYBRID_UNSAFE", unsafe),
            log_interval=_parse_int("DDTREE_LOG_INTERVAL", get("DDTREE_LOG_INTERVAL"), defaults.log_interval),
            selfcheck_every=_parse_int(
                "DDTREE_SELFCHECK_EVERY", get("DDTREE_SELFCHECK_EVERY"), defaults.selfcheck_every, least=0
            ),
            round_graphs_max_bs=_parse_int(
                "DDTREE_ROUND_GRAPHS_MAX_BS", get("DDTREE_ROUND_GRAPHS_MAX_BS"), defaults.round_graphs_max_bs, least=0
            ),
            policy=defaults.policy if policy is None else _parse_policy("DDTREE_POLICY", policy, budget),
            replay_acceptance=get("DDTREE_REPLAY_ACCEPTANCE") or "",
            record_paths=get("DDTREE_RECORD_PATHS") or "",
            record_rounds=get("DDTREE_RECORD_ROUNDS") or "",
            test_policy=get("DDTREE_TEST_POLICY") or "",
            test_demote_spine=demote,
            fused_build=_parse_fused("DDTREE_FUSED_BUILD", get("DDTREE_FUSED_BUILD") or FusedBuild.AUTO.value),
        )

    def to_env(self) -> dict[str, str]:
        """The environment that `from_env` reads back to this config."""
        env = {
            "DDTREE_VERIFY": self.verify.value,
            "DDTREE_BUDGET": str(self.budget),
            "DDTREE_TOPK": str(self.topk),
            "DDTREE_ALLOW_HYBRID_UNSAFE": "1" if self.allow_hybrid_unsafe else "0",
            "DDTREE_LOG_INTERVAL": str(self.log_interval),
            "DDTREE_SELFCHECK_EVERY": str(self.selfcheck_every),
            "DDTREE_ROUND_GRAPHS_MAX_BS": str(self.round_graphs_max_bs),
            "DDTREE_POLICY": self.policy.text,
        }
        hooks = {"DDTREE_REPLAY_ACCEPTANCE": self.replay_acceptance, "DDTREE_RECORD_PATHS": self.record_paths}
        hooks |= {"DDTREE_RECORD_ROUNDS": self.record_rounds, "DDTREE_TEST_POLICY": self.test_policy}
        if self.test_demote_spine:
            hooks["DDTREE_TEST_DEMOTE_SPINE"] = "1"
        if self.fused_build is not FusedBuild.AUTO:
            hooks["DDTREE_FUSED_BUILD"] = self.fused_build.value
        return env | {k: v for k, v in hooks.items() if v}


@lru_cache(maxsize=1)
def process_config() -> DDTreeConfig:
    """This process's configuration, read from its environment once (a bad value: ValueError, one line)."""
    return DDTreeConfig.from_env(os.environ)


@lru_cache(maxsize=1)
def triton_interpreted() -> bool:
    """Whether Triton runs its kernels interpreted in this process (`TRITON_INTERPRET=1`, which triton itself reads
    when the kernels are defined)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _parse_verify(key: str, raw: str) -> Mode:
    modes = tree_modes()
    for mode in modes:
        if mode.value == raw.lower():
            return mode
    raise ValueError(f"{key}={raw!r}: expected one of {', '.join(m.value for m in modes)}")


def _parse_fused(key: str, raw: str) -> FusedBuild:
    try:
        return FusedBuild(raw.lower())
    except ValueError:
        raise ValueError(f"{key}={raw!r}: expected 0, 1 or auto") from None


def _parse_policy(key: str, raw: str, budget: int) -> PolicySetting:
    try:
        setting = PolicySetting.parse(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r}: expected off, auto, chain or tree<N> (1 <= N <= {budget})") from None
    if setting.pinned is not None and setting.pinned.budget > budget:
        raise ValueError(f"{key}={raw!r}: a pinned tree needs N <= DDTREE_BUDGET={budget}")
    return setting


def _parse_int(key: str, raw: str | None, default: int, least: int = 1) -> int:
    if raw is None:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{key}={raw!r}: expected an integer >= {least}") from None
    if value < least:
        raise ValueError(f"{key}={raw!r}: expected an integer >= {least}")
    return value


def _parse_flag(key: str, raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(f"{key}={raw!r}: expected 0 or 1")
    return raw == "1"
