"""pairs_bench.py's JSON -> the markdown tables of docs/runtime-perf.md and a PNG chart (run here, not on the GPU
host: matplotlib is not there).

    python3 dev/sglang_gpu/pairs_report.py docs/results/pairs_bench.json --chart docs/results/pairs_tok_s.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CONCURRENCY = (1, 4, 8, 16, 32)
TREES = ("tree", "tree-policy", "tree-rg")  # variants compared with DFLASH (tree-rg<N>: by prefix)


def variant(entry: dict[str, Any]) -> str:
    """The service's variant; older JSON (no `variant`) has only baseline, linear and tree."""
    return str(entry.get("variant") or entry["mode"])


def label(entry: dict[str, Any]) -> str:
    v = variant(entry)
    names = {"baseline": "baseline", "linear": "linear (DFLASH)", "tree-policy": f"tree-policy b{entry['budget']}"}
    if v.startswith("tree-rg"):
        name = f"tree b{entry['budget']} rg{v[len('tree-rg') :]}"
    else:
        name = names.get(v, f"tree b{entry['budget']}")
    return name + (" [eager]" if entry["eager"] and entry["mode"] == "tree" else "")


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


def ratios(data: dict[str, Any], temp: float = 0.0) -> str:
    """Each tree variant (tree, tree-policy, tree-rg<N>) over DFLASH, tok/s per request at each level."""
    out = [
        f"DDTREE over DFLASH, tok/s per request, temperature {temp:g}:\n",
        "| pair | service | " + " | ".join(f"c={c}" for c in CONCURRENCY) + " |",
        "|---|---" + "|---:" * len(CONCURRENCY) + "|",
    ]
    for pair in ("dense", "hybrid"):
        linear = data["levels"].get(f"{pair}-linear@t{temp:g}")
        if not linear:
            continue
        dflash = {lv["concurrency"]: lv["tok_s_per_request"] for lv in linear["levels"]}
        for e in data["levels"].values():
            if e["pair"] != pair or e["temperature"] != temp or not variant(e).startswith(TREES):
                continue
            mine = {lv["concurrency"]: lv["tok_s_per_request"] for lv in e["levels"]}
            cells = [f"{mine[c] / dflash[c]:.2f}x" if mine.get(c) and dflash.get(c) else "-" for c in CONCURRENCY]
            out.append(f"| {pair} | {label(e)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def fmt_top2(top: Any) -> str:
    """[[logprob, id, text], ...] -> `104 'h' -0.031, 32 ' ' -3.500` (text when the server sent it)."""
    if not top:
        return "-"
    parts = []
    for entry in top[:2]:
        text = f" {entry[2]!r}" if len(entry) > 2 and entry[2] is not None else ""
        parts.append(f"{entry[1]}{text} {entry[0]:.3f}")
    return ", ".join(parts).replace("|", "\\|")


def fmt_gap(gap: Any) -> str:
    return f"{gap:.3f}" if isinstance(gap, int | float) else "-"


def greedy_summary(data: dict[str, Any]) -> str:
    out = ["| service | equal | near-ties | differ |", "|---|---:|---:|---:|"]
    for verdicts in data.get("greedy", {}).values():
        for name, v in verdicts.items():
            if isinstance(v, dict) and "equal" in v:
                out.append(f"| {name} | {v['equal']} | {v['ties']} | {v['diffs']} |")
            else:
                out.append(f"| {name} | {v.get('error', v) if isinstance(v, dict) else v} | | |")
    return "\n".join(out) + "\n"


def diff_table(data: dict[str, Any]) -> str:
    """Every first difference of the greedy check: the baseline's top-2 and gap there, the token the service
    took and the service's own top-2 (re-scored) and gap. Older JSON kept only the verdict rows: those give
    the position (and the gap of a near-tie) and say that nothing more was recorded."""
    out = [
        "| service | prompt | at | verdict | baseline top-2 (id text logprob) | base gap | service token | "
        "service top-2 (re-scored) | service gap |",
        "|---|---:|---:|---|---|---:|---:|---|---:|",
    ]
    for verdicts in data.get("greedy", {}).values():
        for name, v in verdicts.items():
            if not isinstance(v, dict) or "rows" not in v:
                continue
            if "firsts" in v:
                for f in v["firsts"]:
                    svc = fmt_top2(f.get("svc_top2")) if "svc_error" not in f else f"error: {f['svc_error'][:60]}"
                    out.append(
                        f"| {name} | {f['prompt'] + 1} | {f['at'] + 1} | {f['verdict']} | {fmt_top2(f['base_top2'])} "
                        f"| {fmt_gap(f.get('base_gap'))} | {f['svc_token']} | {svc} | {fmt_gap(f.get('svc_gap'))} |"
                    )
                continue
            for i, row in enumerate(v["rows"]):  # older JSON: the verdict strings only
                if row == "equal":
                    continue
                verdict, _, rest = row.partition("@")
                at, _, gap = rest.partition("(")
                out.append(
                    f"| {name} | {i + 1} | {int(at) + 1} | {verdict} | not recorded | {gap.rstrip(')') or '-'} "
                    "| - | not recorded | - |"
                )
    return "\n".join(out) + "\n"


def _cell(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"


def phase_table(data: dict[str, Any], levels: tuple[int, ...] = (16, 32)) -> str:
    """From each level's log slice (`summarize_window`): DDTREE phase means and SGLang's Decode batch lines."""
    out = [
        "| service | temp | conc. | DDTREE lines | tau | draft ms | build ms | verify ms | commit ms | round ms | "
        "decode lines | running | gen tok/s | cuda graph | policy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = 0
    for e in data["levels"].values():
        for lv in e["levels"]:
            log = lv.get("log")
            if lv["concurrency"] not in levels or not isinstance(log, dict):
                continue
            dd, dec = log.get("ddtree") or {}, log.get("decode") or {}
            pol = dd.get("policy") or {}
            policy = f"{pol.get('choice', '')} ({pol.get('switches', 0)} sw)" if pol else "-"
            graph = dec.get("cuda_graph")
            out.append(
                f"| {e['service']} | {e['temperature']:g} | {lv['concurrency']} | {dd.get('lines', 0)} | "
                f"{_cell(dd.get('tau'))} | {_cell(dd.get('draft_ms'))} | {_cell(dd.get('build_ms'))} | "
                f"{_cell(dd.get('verify_ms'))} | {_cell(dd.get('commit_ms'))} | {_cell(dd.get('round_ms'))} | "
                f"{dec.get('lines', 0)} | {_cell(dec.get('running_req'), 1)} | {_cell(dec.get('gen_tok_s'), 0)} | "
                f"{f'{graph:.0%}' if isinstance(graph, int | float) else '-'} | {policy} |"
            )
            rows += 1
    if not rows:
        return "(no per-level log summaries in this JSON: it predates them)\n"
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
    for temp in sorted({float(e["temperature"]) for e in data.get("levels", {}).values()}):
        print(ratios(data, temp))
    print("Greedy check against the baseline:\n")
    print(greedy_summary(data))
    print("First differences of the greedy check (1-based prompt and token):\n")
    print(diff_table(data))
    print("Per level, from the server's log (c=16 and c=32):\n")
    print(phase_table(data))
    if args.chart:
        chart(data, args.chart)
        print(f"chart: {args.chart}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
