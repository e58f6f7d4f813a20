"""Prometheus text exposition (a worker's /metrics) as values: counters, histograms, the difference of two
scrapes and a histogram's quantile. Pure; tested on recorded scrapes of SGLang and the reference server.

Only what a canary needs: samples summed over their labels (a worker's series differ by model name, SGLang's
also by `is_streaming`), histograms by their `le` buckets. Lines are read by `prometheus_client.parser` (label
escapes, timestamps, `+Inf`), one line at a time: the library stops at the first line it cannot read, and here
a line that does not parse is skipped and counted, so one odd line never hides the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Scrape:
    samples: Mapping[str, tuple[tuple[Mapping[str, str], float], ...]]  # name -> (labels, value)
    skipped: int = 0  # lines that did not parse
    error: str = ""  # why there is no scrape (the worker did not answer, or not 200): nothing was read

    def total(self, name: str, where: Mapping[str, str] | None = None) -> float | None:
        """A counter or gauge summed over its label sets (those carrying every label of `where`); None when the
        scrape has no such sample."""
        want = tuple((where or {}).items())
        found = [v for labels, v in self.samples.get(name, ()) if all(labels.get(k) == x for k, x in want)]
        return sum(found) if found else None

    def histogram(self, name: str) -> Histogram | None:
        """`name`'s buckets (summed over the other labels); None when absent."""
        buckets: dict[float, float] = {}
        for labels, value in self.samples.get(name + "_bucket", ()):
            try:
                le = float(labels.get("le", ""))
            except ValueError:
                continue
            buckets[le] = buckets.get(le, 0.0) + value
        if not buckets:
            return None
        return Histogram(tuple(sorted(buckets.items())), self.total(name + "_count") or 0.0)


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending; the last is +Inf
    count: float

    def minus(self, earlier: Histogram | None) -> Histogram:
        """What was observed between `earlier` and this scrape (a restarted worker counts from zero)."""
        if earlier is None or earlier.count > self.count:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, max(0.0, c - before.get(le, 0.0))) for le, c in self.buckets), self.count - earlier.count
        )

    def plus(self, other: Histogram) -> Histogram:
        theirs = dict(other.buckets)
        mine = dict(self.buckets)
        bounds = sorted(set(mine) | set(theirs))
        return Histogram(
            tuple((le, _at(self.buckets, le) + _at(other.buckets, le)) for le in bounds), self.count + other.count
        )

    def quantile(self, q: float) -> float | None:
        """As PromQL's histogram_quantile: linear within the bucket that holds the q-th observation; None
        when nothing was observed; the highest finite bound when it falls in +Inf."""
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                width = cumulative - below
                return lower + (le - lower) * ((rank - below) / width if width > 0 else 1.0)
            lower, below = le, cumulative
        return lower


def _at(buckets: tuple[tuple[float, float], ...], le: float) -> float:
    """Cumulative count at `le` of a histogram that may lack that bound (the nearest lower bound's)."""
    value = 0.0
    for bound, cumulative in buckets:
        if bound > le:
            break
        value = cumulative
    return value


def parse(text: str) -> Scrape:
    # imported here: prometheus_client's package import takes ~60 ms, paid only by commands that read a scrape
    from prometheus_client.parser import text_string_to_metric_families

    def read(chunk: str) -> list[tuple[str, Mapping[str, str], float]]:
        return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(chunk) for s in f.samples]

    try:
        found, skipped = read(text), 0  # the whole scrape at once: the usual case, ~8x faster than line by line
    except ValueError:  # a line the library cannot read: line by line, skipping only such lines
        found, skipped = [], 0
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                found += read(line)
            except ValueError:
                skipped += 1
    samples: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    for name, labels, value in found:
        if math.isnan(value):
            skipped += 1
            continue
        samples.setdefault(name, []).append((dict(labels), float(value)))
    return Scrape({k: tuple(v) for k, v in samples.items()}, skipped)
