"""Pure parsers for the runtime's `DDTREE ...` log lines and SGLang's `Decode batch` lines, and the same numbers
from a service's `ddtree_*` Prometheus series (`from_scrape`).

Both engines print these (docs/architecture.md, "The DDTREE log contract"). Lines are parsed field by field: keys may be
added by newer versions and are kept in `extra`; a line that carries the marker but misses a required key or
has a non-numeric value becomes a `Malformed` record instead of an exception, so one bad line never hides
the rest of a journal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from opsctl.promtext import Scrape

_KV = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)")
_DECODE = re.compile(r"Decode batch[.,]?\s*(?:\[\d+\],?\s*)?(.*)$")


@dataclass(frozen=True)
class DDTreeInit:
    mode: str
    budget: int
    topk: int
    block: int
    hybrid: str  # exact | unsafe | none
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DDTreeVerify:
    accept_length: int
    nodes: int


@dataclass(frozen=True)
class PolicyBucket:
    lo: int  # smallest batch size of the bucket
    hi: int | None  # largest (None: open-ended)
    shape: str  # `tree<N>` or `chain`


@dataclass(frozen=True)
class PolicyState:
    """The shape policy's keys of a `DDTREE metrics` line (appended; absent when the policy is off)."""

    mode: str  # auto | pinned
    shape: str  # the current shape of the latest round's bucket
    choice: tuple[PolicyBucket, ...]  # every bucket used so far, smallest batch first
    estimates: dict[str, float | None]  # the latest bucket: tokens per ms per shape (None: not measured yet)
    switches: int
    probes: int

    def describe(self) -> str:
        """`auto: tree32 at batch 1-8, chain at batch 17-32`: adjacent buckets with one shape merged."""
        groups: list[PolicyBucket] = []
        for b in self.choice:
            last = groups[-1] if groups else None
            if last is not None and last.shape == b.shape and last.hi is not None and last.hi + 1 == b.lo:
                groups[-1] = PolicyBucket(last.lo, b.hi, b.shape)
            else:
                groups.append(b)
        parts = [f"{g.shape} at batch {_batches(g)}" for g in groups]
        shapes = ", ".join(parts) if parts else self.shape
        return f"{self.mode}: {shapes}" if self.mode else shapes  # no mode on /metrics


def _batches(b: PolicyBucket) -> str:
    if b.hi is None:
        return f">= {b.lo}"
    return str(b.lo) if b.lo == b.hi else f"{b.lo}-{b.hi}"


_POLICY_KEYS = ("policy", "shape", "choice", "est", "switches", "probes")
_SHAPE = re.compile(r"chain|tree[1-9][0-9]*")
_BUCKET = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)?:(\S+)")


def _parse_policy(values: dict[str, str]) -> PolicyState:
    """The policy keys (all of them, or ValueError)."""
    missing = [k for k in _POLICY_KEYS if k not in values]
    if missing:
        raise ValueError(f"policy keys without {', '.join(missing)}")
    choice = []
    for part in values["choice"].split(",") if values["choice"] != "-" else []:
        m = _BUCKET.fullmatch(part)
        if m is None or not _SHAPE.fullmatch(m.group(3)):
            raise ValueError(f"bad policy choice {part!r}")
        choice.append(PolicyBucket(int(m.group(1)), int(m.group(2)) if m.group(2) else None, m.group(3)))
    estimates: dict[str, float | None] = {}
    for part in values["est"].split(",") if values["est"] != "-" else []:
        shape, sep, rate = part.partition(":")
        if not sep or not _SHAPE.fullmatch(shape):
            raise ValueError(f"bad policy estimate {part!r}")
        estimates[shape] = None if rate == "-" else float(rate)
    return PolicyState(
        mode=values["policy"],
        shape=values["shape"],
        choice=tuple(choice),
        estimates=estimates,
        switches=int(values["switches"]),
        probes=int(values["probes"]),
    )


@dataclass(frozen=True)
class DDTreeMetrics:
    rounds: int
    tokens: int
    tau: float  # committed tokens per round incl. the bonus token
    nodes: float
    depth: float
    off_spine: float
    draft_ms: float
    build_ms: float
    verify_ms: float
    commit_ms: float
    tok_s: float
    hybrid_unsafe: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    policy: PolicyState | None = None  # the shape policy's keys; None on older lines and with the policy off


@dataclass(frozen=True)
class DecodeBatch:
    running_req: int
    tokens: int | None  # `#token`, or `#full token` on hybrid models
    token_usage: float | None  # `token usage`, or `full token usage`
    gen_throughput: float  # gen throughput (token/s)
    queue_req: int | None
    accept_len: float | None  # only with speculative decoding
    accept_rate: float | None
    mamba_usage: float | None  # hybrid (GDN) models only
    graph: bool | None  # `cuda graph` / `cpu graph`
    hybrid: bool
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Malformed:
    line: str
    reason: str


Record = DDTreeInit | DDTreeVerify | DDTreeMetrics | DecodeBatch | Malformed

_METRICS_FLOATS = (
    "tau",
    "nodes",
    "depth",
    "off_spine",
    "draft_ms",
    "build_ms",
    "verify_ms",
    "commit_ms",
    "tok_s",
)


def _kv(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _KV.finditer(text)}


def parse_ddtree(line: str) -> DDTreeInit | DDTreeVerify | DDTreeMetrics | Malformed | None:
    """One journal line -> a DDTREE record, or None when the line is not a DDTREE line."""
    at = line.find("DDTREE ")
    if at < 0:
        return None
    body = line[at + len("DDTREE ") :].strip()
    kind, _, rest = body.partition(" ")
    values = _kv(rest)
    try:
        if kind == "init":
            known = ("mode", "budget", "topk", "block", "hybrid")
            missing = [k for k in known if k not in values]
            if missing:
                return Malformed(line, f"DDTREE init without {', '.join(missing)}")
            return DDTreeInit(
                mode=values["mode"],
                budget=int(values["budget"]),
                topk=int(values["topk"]),
                block=int(values["block"]),
                hybrid=values["hybrid"],
                extra={k: v for k, v in values.items() if k not in known},
            )
        if kind == "verify":
            if "accept_length" not in values or "nodes" not in values:
                return Malformed(line, "DDTREE verify without accept_length/nodes")
            return DDTreeVerify(int(values["accept_length"]), int(values["nodes"]))
        if kind == "metrics":
            required = ("rounds", "tokens", *_METRICS_FLOATS)
            missing = [k for k in required if k not in values]
            if missing:
                return Malformed(line, f"DDTREE metrics without {', '.join(missing)}")
            f = {k: float(values[k]) for k in _METRICS_FLOATS}
            policy = _parse_policy(values) if "policy" in values else None
            metric_keys = {*required, "hybrid", *(_POLICY_KEYS if policy else ())}
            return DDTreeMetrics(
                rounds=int(values["rounds"]),
                tokens=int(values["tokens"]),
                tau=f["tau"],
                nodes=f["nodes"],
                depth=f["depth"],
                off_spine=f["off_spine"],
                draft_ms=f["draft_ms"],
                build_ms=f["build_ms"],
                verify_ms=f["verify_ms"],
                commit_ms=f["commit_ms"],
                tok_s=f["tok_s"],
                hybrid_unsafe=values.get("hybrid") == "unsafe",
                extra={k: v for k, v in values.items() if k not in metric_keys},
                policy=policy,
            )
    except ValueError as exc:
        return Malformed(line, f"DDTREE {kind}: {exc}")
    return Malformed(line, f"unknown DDTREE line kind {kind!r}")


def _num(text: str) -> float:
    return float(text.rstrip(",").strip())


def parse_decode_batch(line: str) -> DecodeBatch | Malformed | None:
    """SGLang's `Decode batch, #running-req: N, #token: T, ...` (dense) or the hybrid variant with
    `#full token`, `full token usage`, `mamba usage`; field by field, order-independent."""
    match = _DECODE.search(line)
    if not match:
        return None
    fields: dict[str, str] = {}
    for part in match.group(1).split(", "):
        key, sep, value = part.strip().rstrip(",").partition(": ")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        if "#running-req" not in fields or "gen throughput (token/s)" not in fields:
            return Malformed(line, "Decode batch without #running-req/gen throughput")
        hybrid = "#full token" in fields or "mamba usage" in fields
        tokens = fields.get("#full token", fields.get("#token"))
        usage = fields.get("full token usage", fields.get("token usage"))
        graph_text = fields.get("cuda graph", fields.get("cpu graph"))
        known = {
            "#running-req", "#token", "#full token", "token usage", "full token usage", "gen throughput (token/s)",
            "#queue-req", "accept len", "accept rate", "mamba usage", "cuda graph", "cpu graph",
        }  # fmt: skip
        return DecodeBatch(
            running_req=int(fields["#running-req"]),
            tokens=int(tokens) if tokens is not None else None,
            token_usage=_num(usage) if usage is not None else None,
            gen_throughput=_num(fields["gen throughput (token/s)"]),
            queue_req=int(fields["#queue-req"]) if "#queue-req" in fields else None,
            accept_len=_num(fields["accept len"]) if "accept len" in fields else None,
            accept_rate=_num(fields["accept rate"]) if "accept rate" in fields else None,
            mamba_usage=_num(fields["mamba usage"]) if "mamba usage" in fields else None,
            graph=(graph_text == "True") if graph_text is not None else None,
            hybrid=hybrid,
            extra={k: v for k, v in fields.items() if k not in known},
        )
    except ValueError as exc:
        return Malformed(line, f"Decode batch: {exc}")


def parse_line(line: str) -> Record | None:
    record: Record | None = parse_ddtree(line)
    if record is None:
        record = parse_decode_batch(line)
    return record


def parse_lines(lines: Iterable[str]) -> list[Record]:
    return [r for r in (parse_line(line) for line in lines) if r is not None]


@dataclass(frozen=True)
class MetricsSummary:
    """What `opsctl logs --metrics` and `opsctl status` show for one service."""

    init: DDTreeInit | None
    first_verify: DDTreeVerify | None
    last_metrics: DDTreeMetrics | None
    metrics_lines: int
    decode_lines: int
    last_decode: DecodeBatch | None
    mean_accept_len: float | None  # over Decode batch lines that carry one
    malformed: int
    hybrid_unsafe: bool


def summarize(records: Iterable[Record]) -> MetricsSummary:
    init: DDTreeInit | None = None
    verify: DDTreeVerify | None = None
    last: DDTreeMetrics | None = None
    last_decode: DecodeBatch | None = None
    n_metrics = n_decode = n_bad = 0
    accepts: list[float] = []
    unsafe = False
    for r in records:
        if isinstance(r, DDTreeInit):
            init, verify, last = r, None, None  # a new process: earlier lines describe an older run
            unsafe = r.hybrid == "unsafe"
        elif isinstance(r, DDTreeVerify):
            verify = verify or r
        elif isinstance(r, DDTreeMetrics):
            last = r
            n_metrics += 1
            unsafe = unsafe or r.hybrid_unsafe
        elif isinstance(r, DecodeBatch):
            last_decode = r
            n_decode += 1
            if r.accept_len is not None:
                accepts.append(r.accept_len)
        else:
            n_bad += 1
    mean = sum(accepts) / len(accepts) if accepts else None
    return MetricsSummary(init, verify, last, n_metrics, n_decode, last_decode, mean, n_bad, unsafe)


_PHASES = ("draft", "build", "verify", "commit")


def from_scrape(scrape: Scrape) -> DDTreeMetrics | None:
    """A service's DDTREE numbers from its `/metrics` (the `ddtree_*` series, ddtree.prom, docs/monitoring.md),
    as a `DDTreeMetrics`: the counters since the process started, where a metrics line holds one window's means
    (`rounds` and `tokens` are the same; `tau`, `nodes`, `depth`, `width`, `off_spine`, the `*_ms` and `tok_s`
    are means over every round since start). `policy` (when the series carry a shape) has the shape per bucket,
    switches and probes, and neither the mode (`auto` or a pinned shape) nor estimates.

    None when the scrape has no `ddtree_rounds_total` (not a DDTREE service, or one without the series) or no
    round yet."""
    rounds = scrape.total("ddtree_rounds_total")
    if rounds is None or rounds <= 0:
        return None
    tokens = scrape.total("ddtree_committed_tokens_total") or 0.0

    def mean(histogram: str) -> float:
        total, count = scrape.total(f"{histogram}_sum"), scrape.total(f"{histogram}_count")
        return total / count if total is not None and count else 0.0

    phase_s = {p: scrape.total("ddtree_phase_seconds_total", {"phase": p}) or 0.0 for p in _PHASES}
    busy_s = sum(phase_s.values())
    return DDTreeMetrics(
        rounds=int(rounds),
        tokens=int(tokens),
        tau=tokens / rounds,
        nodes=mean("ddtree_tree_nodes"),
        depth=mean("ddtree_tree_depth"),
        off_spine=(scrape.total("ddtree_off_spine_rounds_total") or 0.0) / rounds,
        draft_ms=phase_s["draft"] * 1000.0 / rounds,
        build_ms=phase_s["build"] * 1000.0 / rounds,
        verify_ms=phase_s["verify"] * 1000.0 / rounds,
        commit_ms=phase_s["commit"] * 1000.0 / rounds,
        tok_s=tokens / busy_s if busy_s > 0 else 0.0,
        extra={"width": f"{mean('ddtree_tree_width'):.3f}"},
        policy=_policy_from_scrape(scrape),
    )


def _policy_from_scrape(scrape: Scrape) -> PolicyState | None:
    """`ddtree_policy_shape_budget{bucket}` (tree nodes, 0 for the chain) and the switch and probe counters;
    None when no bucket has a shape (the policy off, or no line written yet)."""
    buckets: dict[tuple[int, int | None], str] = {}
    for labels, value in scrape.samples.get("ddtree_policy_shape_budget", ()):
        m = re.fullmatch(r"([1-9][0-9]*)-([1-9][0-9]*)?", labels.get("bucket", ""))
        if m is None or value < 0 or value != int(value):
            continue
        key = (int(m.group(1)), int(m.group(2)) if m.group(2) else None)
        buckets[key] = "chain" if value == 0 else f"tree{int(value)}"
    if not buckets:
        return None
    choice = tuple(PolicyBucket(lo, hi, shape) for (lo, hi), shape in sorted(buckets.items(), key=lambda kv: kv[0][0]))
    return PolicyState(
        mode="",
        shape="-",
        choice=choice,
        estimates={},
        switches=int(scrape.total("ddtree_policy_switches_total") or 0),
        probes=int(scrape.total("ddtree_policy_probes_total") or 0),
    )
