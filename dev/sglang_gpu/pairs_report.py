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


def _by_c(entry: dict[str, Any] | None, key: str = "tok_s_per_request") -> dict[int, float]:
    return {lv["concurrency"]: lv[key] for lv in entry["levels"] if lv.get(key)} if entry else {}


def baseline_ratios(data: dict[str, Any], temp: float = 0.0) -> str:
    """Every speculative service over its pair's baseline (the baseline runs greedy only: at temperature 1 the
    speculative services are compared with the greedy baseline, which says what sampling costs them)."""
    out = [
        f"Over the baseline (greedy), tok/s per request, temperature {temp:g}:\n",
        "| pair | service | " + " | ".join(f"c={c}" for c in CONCURRENCY) + " |",
        "|---|---" + "|---:" * len(CONCURRENCY) + "|",
    ]
    for pair in ("dense", "hybrid"):
        base = _by_c(data["levels"].get(f"{pair}-base@t0"))
        if not base:
            continue
        for e in data["levels"].values():
            if e["pair"] != pair or e["temperature"] != temp or variant(e) == "baseline":
                continue
            mine = _by_c(e)
            cells = [f"{mine[c] / base[c]:.2f}x" if mine.get(c) and base.get(c) else "-" for c in CONCURRENCY]
            out.append(f"| {pair} | {label(e)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def policy_vs_best(data: dict[str, Any], temp: float = 0.0, within: float = 0.03) -> str:
    """The policy's goal, per pair and level: tree-policy against the better of linear and the best fixed tree
    (variant `tree`: every plain budget of the run), tok/s per request, in the same run."""
    out = [
        f"tree-policy against the best of linear and the fixed trees, tok/s per request, temperature {temp:g}:\n",
        "| pair | policy | conc. | linear | best fixed tree | best | policy | policy / best | within 3% "
        "| policy's shapes |",
        "|---|---|---:|---:|---|---|---:|---:|---|---|",
    ]
    for pair in ("dense", "hybrid"):
        rows = [e for e in data["levels"].values() if e["pair"] == pair and e["temperature"] == temp]
        linear = _by_c(next((e for e in rows if variant(e) == "linear"), None))
        trees = [(label(e), _by_c(e)) for e in rows if variant(e) == "tree"]
        for pol in (e for e in rows if variant(e) == "tree-policy"):
            mine = _by_c(pol)
            logs = {lv["concurrency"]: lv.get("log") or {} for lv in pol["levels"]}
            for c in CONCURRENCY:
                if not mine.get(c):
                    continue
                fixed = max(((t[c], name) for name, t in trees if t.get(c)), default=None)
                cands = [(v, n) for v, n in ((linear.get(c), "linear"), fixed or (None, "")) if v]
                if not cands:
                    continue
                best, best_name = max(cands)
                choice = ((logs[c].get("ddtree") or {}).get("policy") or {}).get("choice", "-")
                ratio = mine[c] / best
                out.append(
                    f"| {pair} | {label(pol)} | {c} | {_cell(linear.get(c), 0)} | "
                    f"{f'{fixed[1]} {fixed[0]:.0f}' if fixed else '-'} | {best_name} | {mine[c]:.0f} | "
                    f"{ratio:.3f} | {'yes' if ratio >= 1 - within else 'no'} | {choice} |"
                )
    return "\n".join(out) + "\n"


def iteration_table(data: dict[str, Any], temp: float = 0.0) -> str:
    """Time per decode iteration per request, from SGLang's `Decode batch` lines of each level: 1000 *
    accept_len / gen_tok_s ms (an iteration serves `running` requests and yields accept_len tokens each), with
    the accept length beside it (the baseline's is 1); docs/runtime-perf.md ("Small pairs on real text")
    reads the policy's chain iterations against DFLASH's with it."""
    out = [
        f"Decode iteration per request (ms) and accept length, from the Decode batch lines, temperature {temp:g}:\n",
        "| pair | service | " + " | ".join(f"c={c}" for c in CONCURRENCY) + " |",
        "|---|---" + "|---:" * len(CONCURRENCY) + "|",
    ]
    for e in data["levels"].values():
        if e["temperature"] != temp:
            continue
        cells = []
        for c in CONCURRENCY:
            lv = next((x for x in e["levels"] if x["concurrency"] == c), None)
            dec = ((lv or {}).get("log") or {}).get("decode") or {}
            gen, acc = dec.get("gen_tok_s"), dec.get("accept_len") or 1.0
            cells.append(f"{1000 * acc / gen:.2f} ({acc:.2f})" if gen else "-")
        out.append(f"| {e['pair']} | {label(e)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def _spread(values: list[float], digits: int = 0, suffix: str = "") -> str:
    """`median [min-max]` of the runs' values (one run: the value alone)."""
    if not values:
        return "-"
    med = f"{_median(values):.{digits}f}{suffix}"
    return med if len(values) == 1 else f"{med} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def runs_tables(runs: list[dict[str, Any]], temp: float = 0.0) -> str:
    """Several runs of the same services (separate JSON files): tok/s per request as the median of the runs with
    their range, tau, ITL and TTFT medians; then each tree variant over DFLASH and each service over the
    baseline as the median [range] of the per-run ratios (a ratio is taken within one run, never across)."""
    names: dict[str, dict[str, Any]] = {}
    for data in runs:
        for key, e in data.get("levels", {}).items():
            if e["temperature"] == temp:
                names.setdefault(key, e)
    if not names:
        return ""
    head = "| pair | service | runs | " + " | ".join(f"c={c}" for c in CONCURRENCY)
    out = [f"tok/s per request, temperature {temp:g}: median of the runs [min-max]\n"]
    out += [
        head + " | tau | ITL ms c=1 / c=32 | TTFT ms c=1 |",
        "|---|---|---:" + "|---:" * (len(CONCURRENCY) + 3) + "|",
    ]
    for key, e in names.items():
        got = [d["levels"][key] for d in runs if key in d.get("levels", {})]
        cells = [_spread([v for g in got if (v := _by_c(g).get(c))]) for c in CONCURRENCY]
        taus = [lv["tau"] for g in got for lv in g["levels"] if lv.get("tau")]
        itl1 = [lv["itl_s"] * 1000 for g in got for lv in g["levels"] if lv["concurrency"] == 1]
        itl32 = [lv["itl_s"] * 1000 for g in got for lv in g["levels"] if lv["concurrency"] == 32]
        ttft = [lv["ttft_s"] * 1000 for g in got for lv in g["levels"] if lv["concurrency"] == 1]
        out.append(
            f"| {e['pair']} | {label(e)} | {len(got)} | " + " | ".join(cells) + f" | {_spread(taus, 2)} | "
            f"{_spread(itl1, 2)} / {_spread(itl32, 2)} | {_spread(ttft, 1)} |"
        )
    for title, ref_key, keep in (
        ("each tree variant over DFLASH (linear)", f"-linear@t{temp:g}", TREES),
        ("each service over the greedy baseline", "-base@t0", ("linear", *TREES)),
    ):
        out += [
            f"\nRatios, {title}, temperature {temp:g}: median of the per-run ratios [min-max]\n",
            "| pair | service | " + " | ".join(f"c={c}" for c in CONCURRENCY) + " |",
            "|---|---" + "|---:" * len(CONCURRENCY) + "|",
        ]
        for key, e in names.items():
            if not variant(e).startswith(keep):
                continue
            cells = []
            for c in CONCURRENCY:
                per_run = []
                for d in runs:
                    mine, ref = d.get("levels", {}).get(key), d.get("levels", {}).get(e["pair"] + ref_key)
                    if (a := _by_c(mine).get(c)) and (b := _by_c(ref).get(c)):
                        per_run.append(a / b)
                cells.append(_spread(per_run, 2, "x"))
            out.append(f"| {e['pair']} | {label(e)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def greedy_runs(runs: list[dict[str, Any]]) -> str:
    """The greedy checks of several runs: counts per check, and over every first difference the largest gap
    between the baseline's best log-prob and the token the service took (top-5), and how many of those tokens
    were not in the baseline's top-2 (three-way ties or wider)."""
    out = [
        "| service | checks | prompts | equal | near-ties | differ | largest gap of a taken token | taken token "
        "outside the baseline's top-2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    totals: dict[str, list[Any]] = {}
    for data in runs:
        for verdicts in data.get("greedy", {}).values():
            for name, v in verdicts.items():
                t = totals.setdefault(name, [0, 0, 0, 0, 0, [], 0])
                if not isinstance(v, dict) or "equal" not in v:
                    continue
                t[0] += 1
                t[1] += len(v["rows"])
                t[2], t[3], t[4] = t[2] + v["equal"], t[3] + v["ties"], t[4] + v["diffs"]
                for f in v.get("firsts", []):
                    if f.get("svc_token_gap") is not None:
                        t[5].append(f["svc_token_gap"])
                    t[6] += f["svc_token"] not in [x[1] for x in f["base_top2"]]
    for name, (checks, prompts, eq, ties, diffs, gaps, outside) in totals.items():
        gap = f"{max(gaps):.3f}" if gaps else "-"
        out.append(f"| {name} | {checks} | {prompts} | {eq} | {ties} | {diffs} | {gap} | {outside} |")
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
    p.add_argument("json", type=Path, nargs="+", help="one run; several: the runs' medians and ranges only")
    p.add_argument("--chart", type=Path)
    args = p.parse_args()
    if len(args.json) > 1:
        runs = [json.loads(f.read_text()) for f in args.json]
        for temp in sorted({float(e["temperature"]) for d in runs for e in d.get("levels", {}).values()}):
            print(runs_tables(runs, temp))
        print("Greedy checks against the baseline, every run:\n")
        print(greedy_runs(runs))
        return 0
    data = json.loads(args.json[0].read_text())
    print(tables(data))
    for temp in sorted({float(e["temperature"]) for e in data.get("levels", {}).values()}):
        print(ratios(data, temp))
        print(baseline_ratios(data, temp))
        print(policy_vs_best(data, temp))
        print(iteration_table(data, temp))
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
