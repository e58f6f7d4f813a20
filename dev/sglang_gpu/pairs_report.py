"""pairs_bench.py's JSON -> the markdown tables of docs/runtime-perf.md and a PNG chart (run here, not on the GPU
host: matplotlib is not there).

    python3 dev/sglang_gpu/pairs_report.py docs/results/pairs_bench.json --chart docs/results/pairs_tok_s.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def label(entry: dict[str, Any]) -> str:
    mode = {"baseline": "baseline", "linear": "linear (DFLASH)"}.get(entry["mode"], f"tree b{entry['budget']}")
    return mode + (" [eager]" if entry["eager"] and entry["mode"] == "tree" else "")


def tables(data: dict[str, Any]) -> str:
    out = []
    for pair in ("dense", "hybrid"):
        for temp in (0.0, 1.0):
            rows = [e for e in data["levels"].values() if e["pair"] == pair and e["temperature"] == temp]
            if not rows:
                continue
            out.append(f"\n**{pair} pair, temperature {temp:g}**\n")
            out.append("| mode | conc. | tok/s per request | tok/s per GPU | TTFT ms | ITL ms | tau |")
            out.append("|---|---:|---:|---:|---:|---:|---:|")
            for e in rows:
                for lv in e["levels"]:
                    tau = f"{lv['tau']:.2f}" if lv["tau"] is not None else "-"
                    out.append(
                        f"| {label(e)} | {lv['concurrency']} | {lv['tok_s_per_request']:.0f} | "
                        f"{lv['tok_s_per_gpu']:.0f} | {lv['ttft_s'] * 1000:.1f} | {lv['itl_s'] * 1000:.2f} | {tau} |"
                    )
    return "\n".join(out) + "\n"


def ratios(data: dict[str, Any]) -> str:
    """DDTREE over DFLASH per request at each level (greedy), per pair and budget."""
    out = [
        "| pair | budget | " + " | ".join(f"c={c}" for c in (1, 4, 8, 16, 32)) + " |",
        "|---|---:" + "|---:" * 5 + "|",
    ]
    for pair in ("dense", "hybrid"):
        linear = data["levels"].get(f"{pair}-linear@t0")
        if not linear:
            continue
        base = {lv["concurrency"]: lv["tok_s_per_request"] for lv in linear["levels"]}
        for key, e in data["levels"].items():
            if e["pair"] == pair and e["mode"] == "tree" and key.endswith("@t0"):
                cells = [
                    f"{lv['tok_s_per_request'] / base[lv['concurrency']]:.2f}x" if base.get(lv["concurrency"]) else "-"
                    for lv in e["levels"]
                ]
                out.append(f"| {pair} | {e['budget']}{' (eager)' if e['eager'] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for col, pair in enumerate(("dense", "hybrid")):
        for row, (key, title) in enumerate(
            (("tok_s_per_request", "tok/s per request"), ("tok_s_per_gpu", "tok/s per GPU"))
        ):
            ax = axes[row][col]
            for e in data["levels"].values():
                if e["pair"] != pair or e["temperature"] != 0:
                    continue
                xs = [lv["concurrency"] for lv in e["levels"]]
                ax.plot(xs, [lv[key] for lv in e["levels"]], marker="o", label=label(e))
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 4, 8, 16, 32], ["1", "4", "8", "16", "32"])
            ax.set_title(f"{pair} pair: {title} (greedy)")
            ax.set_xlabel("concurrent requests")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("Small pairs on real text, SGLang 0.5.23 on one H200 (torch stand-in kernels; see docs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("json", type=Path)
    p.add_argument("--chart", type=Path)
    args = p.parse_args()
    data = json.loads(args.json.read_text())
    print(tables(data))
    print(ratios(data))
    if args.chart:
        chart(data, args.chart)
        print(f"chart: {args.chart}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
