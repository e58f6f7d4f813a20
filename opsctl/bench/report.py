"""Aggregate benchmark samples per arm (service x setting), compare arms, and flag biasing differences."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from opsctl.bench.measure import Sample

# Server settings that change throughput independently of the speculative mode; arms should agree on them.
BIAS_KEYS = ("disable_overlap_schedule", "disable_cuda_graph", "attention_backend", "dtype", "device", "page_size")


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        return Spread(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class Arm:
    """One measured configuration: a service (and, in a sweep, a budget/top-k setting)."""

    label: str
    host: str
    service: str
    mode: str
    engine: str
    settings: Mapping[str, object]  # from /server_info: what could bias a comparison
    samples: tuple[Sample, ...]
    accept_length: float | None  # mean committed tokens per verify round (tau), from the server
    budget: int | None = None
    topk: int | None = None


@dataclass(frozen=True)
class ArmSummary:
    label: str
    mode: str
    requests: int
    completion_tokens: int
    tok_s: Spread
    ttft_s: Spread
    accept_length: float | None
    ratio: float  # median tok/s relative to the first arm
    budget: int | None
    topk: int | None


@dataclass(frozen=True)
class Report:
    arms: tuple[Arm, ...]
    summaries: tuple[ArmSummary, ...]
    warnings: tuple[str, ...] = field(default=())


def summarize(arms: Sequence[Arm]) -> Report:
    summaries: list[ArmSummary] = []
    reference: float | None = None
    for arm in arms:
        tok = Spread.of([s.tok_s for s in arm.samples])
        reference = tok.median if reference is None else reference
        summaries.append(
            ArmSummary(
                label=arm.label,
                mode=arm.mode,
                requests=len(arm.samples),
                completion_tokens=sum(s.completion_tokens for s in arm.samples),
                tok_s=tok,
                ttft_s=Spread.of([s.ttft_s for s in arm.samples]),
                accept_length=arm.accept_length,
                ratio=tok.median / reference if reference else 0.0,
                budget=arm.budget,
                topk=arm.topk,
            )
        )
    return Report(tuple(arms), tuple(summaries), tuple(bias_warnings(arms)))


def bias_warnings(arms: Sequence[Arm]) -> list[str]:
    warnings: list[str] = []
    for key in BIAS_KEYS:
        values = {arm.label: arm.settings.get(key) for arm in arms if key in arm.settings}
        if len(set(map(str, values.values()))) > 1:
            listed = ", ".join(f"{label}={value}" for label, value in values.items())
            warnings.append(f"arms differ in {key}: {listed}")
    if len({arm.engine for arm in arms}) > 1:
        warnings.append("arms run on different engines: " + ", ".join(f"{a.label}={a.engine}" for a in arms))
    return warnings


def table_rows(report: Report) -> list[list[str]]:
    rows = []
    for s in report.summaries:
        rows.append(
            [
                s.label,
                s.mode,
                "-" if s.budget is None else str(s.budget),
                str(s.requests),
                f"{s.tok_s.median:.1f}",
                f"{s.tok_s.min:.1f}-{s.tok_s.max:.1f}",
                f"{s.ttft_s.median * 1000:.0f}",
                "-" if s.accept_length is None else f"{s.accept_length:.2f}",
                f"{s.ratio:.2f}x",
            ]
        )
    return rows


TABLE_HEADER = ["arm", "mode", "budget", "reqs", "tok/s med", "tok/s min-max", "ttft ms", "tau", "vs first"]


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format -> {metric name (labels dropped): value}; the last sample of a name wins."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        name = name_part.split("{", 1)[0]
        if "{" in name_part and "}" not in name_part:  # labels with spaces: value follows the closing brace
            _, _, rest = line.partition("} ")
        try:
            values[name] = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
    return values
