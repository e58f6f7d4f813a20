"""PNG chart of tok/s and tau per arm. matplotlib is imported lazily (optional `bench` extra)."""

from __future__ import annotations

from pathlib import Path

from opsctl.bench.report import Report
from opsctl.errors import OpsctlError


def write_chart(report: Report, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OpsctlError("matplotlib is not installed", "pip install 'opsctl[bench]' or drop --chart") from None
    labels = [s.label for s in report.summaries]
    medians = [s.tok_s.median for s in report.summaries]
    low = [s.tok_s.median - s.tok_s.min for s in report.summaries]
    high = [s.tok_s.max - s.tok_s.median for s in report.summaries]
    taus = [s.accept_length or 0.0 for s in report.summaries]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(labels) + 4), 4.5))
    left.bar(labels, medians, yerr=[low, high], capsize=4, color="#4878a8")
    left.set_title("output tok/s (median, min-max)")
    left.set_ylabel("tokens / s")
    right.bar(labels, taus, color="#6a9a58")
    right.set_title("acceptance length tau (tokens / round)")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise OpsctlError(f"cannot write chart {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
