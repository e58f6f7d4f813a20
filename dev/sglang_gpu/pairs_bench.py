"""On the GPU host: the small pairs trained on real text, served the way opsctl renders them, measured
per mode against concurrency with `opsctl bench`'s own code.

Run through `bash dev/sglang_gpu/run.sh pairs` (SGLang's wheels, the runtime and the stand-in set up). Steps:
1. builds or reuses both pairs (`python -m ddtree.pairs build --device cuda`, the two at once) from the corpus
   wheels in `--wheels`;
2. writes an inventory (host 127.0.0.1; per pair baseline, linear, tree at each `--budgets`, tree with
   `ddtree.policy: auto` at each `--policy-budgets`, and on the dense pair a tree whose round graphs cover
   batches up to `--rg-max-bs`; `service_plan`), renders it with `opsctl.render`, and starts every service
   by hand (no systemd here): its rendered ExecStart with the rendered EnvironmentFile, the venv's python and
   the release dir swapped for this host's, all services at once on the one GPU (`--mem-fraction`);
3. greedy check: every held-out prompt (token ids) through each speculative service's native /generate, all
   services at once, compared with the baseline's tokens; a first difference is a near-tie when the token the
   service took is in the baseline's top-5 there within `--tie-margin` (bf16) of its best (exact ties in any
   order, three-way ties included); every first difference keeps the baseline's top-2 and the service's
   (re-scored) top-2;
4. `opsctl.bench.load.bench_levels` (what `opsctl bench --concurrency` runs) per service, one service at a time,
   every service greedy first, then linear / tree / tree-policy at temperature 1; each level keeps a summary
   of its slice of the server's log (`summarize_window`: DDTREE phase timings, Decode batch lines, policy
   switches);
5. one JSON (`--json`): builds, inventory, rendered flags, greedy verdicts, levels; server logs in one tar.gz.
Exit 1 when a greedy tree output differs from the baseline beyond a near-tie, or a service failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # opsctl is not installed here: its inventory, render and bench code from the tree

ARCHES = {"dense": "qwen3", "hybrid": "qwen3_5"}


def build_pairs(
    wheels: Path,
    cache: Path,
    log_dir: Path,
    names: list[str],
    scale: str,
    device: str,
    on_ready: Callable[[str, dict[str, Any]], None],
) -> dict[str, dict[str, Any]]:
    """Both builds at once; `on_ready(pair, build)` as each one finishes (its servers start while the other
    builds: nine servers starting together took ~3 min on the H200 host's 16 cores)."""
    procs = {}
    for pair, arch in ARCHES.items():
        if pair not in names:
            continue
        cmd = [sys.executable, "-m", "ddtree.pairs", "build", "--arch", arch, "--wheels", str(wheels)]
        cmd += ["--cache", str(cache), "--device", device, "--scale", scale, "--threads", "4"]
        log = (log_dir / f"build-{pair}.log").open("w")
        procs[pair] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True), log)
    out: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 420
    while len(out) < len(procs):
        done = [(k, v) for k, v in procs.items() if k not in out and v[0].poll() is not None]
        if not done:
            if time.monotonic() > deadline:
                raise SystemExit(f"pair builds still running after 420 s: {sorted(set(procs) - set(out))}")
            time.sleep(1)
            continue
        pair, (proc, log) = done[0]
        stdout = proc.stdout.read() if proc.stdout else ""
        log.close()
        if proc.returncode != 0:
            tail = (log_dir / f"build-{pair}.log").read_text()[-3000:]
            raise SystemExit(f"build of the {pair} pair failed ({proc.returncode}):\n{tail}")
        summary = json.loads(stdout.strip().splitlines()[-1])
        built = Path(summary["dir"])
        # opsctl serves models from /dev/shm/ (the loader insists); a link there keeps the files where they are
        shm = Path("/dev/shm/pairs") / built.name
        shm.parent.mkdir(parents=True, exist_ok=True)
        if not shm.is_symlink():
            shm.symlink_to(built)
        report = json.loads((built / "build.json").read_text())
        out[pair] = report | {"dir": str(built), "shm_dir": str(shm), "built_now": summary["built"]}
        print(f"pair {pair}: {json.dumps(summary)}", flush=True)
        on_ready(pair, out[pair])
    return out


@dataclass(frozen=True)
class ServiceSpec:
    """One service of the run: what the inventory says, what this host adds, and which temperatures it gets."""

    name: str  # `<pair>-<short>`
    pair: str
    mode: str  # baseline | linear | tree
    variant: str  # baseline | linear | tree | tree-policy | tree-rg<N> | rustcore
    budget: int | None = None
    policy: str | None = None  # the inventory's ddtree.policy (tree-policy)
    host_env: tuple[tuple[str, str], ...] = ()  # set by this script, not the inventory (see service_plan)
    temperatures: tuple[float, ...] = (0.0,)


def service_plan(pairs: list[str], args: argparse.Namespace) -> list[ServiceSpec]:
    """Per pair: baseline, linear, tree at each `--budgets`, tree-policy at each `--policy-budgets`; on the
    dense pair a tree at each `--rg-budgets` with its round graphs up to `--rg-max-bs` (the c=32 question);
    the Rust-TreeCore probe only with `--rust-probe 1`. Temperature 1 only where sampling differs by mode
    (linear, tree, tree-policy): the baseline and the graph variant are greedy only."""
    temps = tuple(float(t) for t in args.temperatures.split(",") if t)
    greedy = tuple(t for t in temps if t == 0) or temps[:1]
    out: list[ServiceSpec] = []
    for pair in pairs:
        out += [
            ServiceSpec(f"{pair}-base", pair, "baseline", "baseline", temperatures=greedy),
            ServiceSpec(f"{pair}-linear", pair, "linear", "linear", temperatures=temps),
        ]
        out += [ServiceSpec(f"{pair}-tree{b}", pair, "tree", "tree", b, temperatures=temps) for b in args.budgets]
        out += [
            ServiceSpec(f"{pair}-policy{b}", pair, "tree", "tree-policy", b, policy="auto", temperatures=temps)
            for b in args.policy_budgets
        ]
        if pair == "dense":
            # not through extra_env: the inventory loader refuses DDTREE_* there (opsctl renders those itself,
            # and has no key for the round graphs), so the server's environment gets it here, in the JSON
            rg = (("DDTREE_ROUND_GRAPHS_MAX_BS", str(args.rg_max_bs)),)
            out += [
                ServiceSpec(
                    f"{pair}-tree{b}rg{args.rg_max_bs}", pair, "tree", f"tree-rg{args.rg_max_bs}", b, None, rg, greedy
                )
                for b in args.rg_budgets
            ]
    if args.rust_probe and "dense" in pairs:  # SGLang's default radix TreeCore (Rust), to see it crash or not
        out.append(ServiceSpec("dense-rustcore", "dense", "baseline", "rustcore", temperatures=()))
    return out


def inventory_yaml(pairs: dict[str, dict[str, Any]], specs: list[ServiceSpec], args: argparse.Namespace) -> str:
    # opsctl gives each service its own GPUs (the loader refuses sharing); here they all run on the one GPU
    # (Server overrides CUDA_VISIBLE_DEVICES), which a production host would not do
    lines = ["hosts:", "  h200:", "    address: 127.0.0.1", "    gpus: 64", "    services:"]
    first = list(ARCHES).index(next(iter(pairs)))  # one inventory per pair: ports and GPU indices apart
    port, gpu = args.port + 16 * first, 16 * first
    for spec in (s for s in specs if s.pair in pairs):
        d = pairs[spec.pair]["shm_dir"]
        hybrid = "true" if spec.pair == "hybrid" else "false"
        lines += [
            f"      {spec.name}:",
            f"        gpus: [{gpu}]",
            f"        port: {port}",
            f"        mode: {spec.mode}",
            f"        model: {{source: {d}/target, source_on: host, path: {d}/target, hybrid: {hybrid}}}",
        ]
        if spec.mode != "baseline":
            lines.append(f"        draft_model: {{source: {d}/draft, source_on: host, path: {d}/draft}}")
        if spec.budget is not None:
            policy = f", policy: {spec.policy}" if spec.policy else ""
            lines.append(f"        ddtree: {{budget: {spec.budget}, topk: {args.topk}{policy}}}")
        lines.append(f"        extra_args: {json.dumps(host_args(spec.mode, spec.pair == 'hybrid', args))}")
        if args.radix_core and spec.variant != "rustcore":
            lines.append(f"        extra_env: {{SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: {args.radix_core}}}")
        port, gpu = port + 1, gpu + 1
    return "\n".join(lines) + "\n"


def host_args(mode: str, hybrid: bool, args: argparse.Namespace) -> list[str]:
    """What this host adds to the rendered flags: SGLang's flashinfer samplers and FA3 are absent (the torch
    stand-in), several servers share the one GPU; baseline and linear get the backend, page size and schedule
    opsctl renders for tree, so every arm agrees on them (opsctl bench's bias keys)."""
    extra = ["--sampling-backend", "pytorch", "--mem-fraction-static", str(args.mem_fraction)]
    extra += ["--max-total-tokens", str(args.max_total_tokens), "--max-running-requests", str(max(args.concurrency))]
    extra += ["--cuda-graph-max-bs-decode", "32", "--skip-server-warmup"]
    # a `Decode batch` line every N rounds instead of 40, every arm alike: a c=32 level lasts ~50-100 rounds
    extra += ["--decode-log-interval", str(args.decode_log_interval)]
    if hybrid:  # the Mamba state pool is otherwise sized from the (large) memory left over
        extra += ["--max-mamba-cache-size", str(2 * max(args.concurrency) + 8)]
    if mode in ("baseline", "linear"):
        extra += ["--attention-backend", "triton", "--page-size", "1", "--disable-overlap-schedule"]
    return extra


def parse_env_file(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        env[key.strip()] = value
    return env


class Server:
    def __init__(
        self, name: str, rendered: Any, venv: str, run_dir: Path, log_dir: Path, host_env: Iterable[tuple[str, str]]
    ) -> None:
        self.name = name
        run_dir.mkdir(parents=True, exist_ok=True)
        release = rendered.release_dir
        for f in rendered.files:
            (run_dir / f.name).write_text(f.text.replace(release, str(run_dir)))
        env = parse_env_file((run_dir / "env").read_text())
        # what the rendered EnvironmentFile says, except where this host differs from a provisioned one: the
        # runtime and SGLang come from run.sh's PYTHONPATH (site + stand-in), not <release>/site; PATH as is
        for key in ("PYTHONPATH", "PATH", "CUDA_HOME"):
            env.pop(key, None)
        # PYTHONUNBUFFERED: the log is cut per level by byte offset, so a line must be in the file when it is made
        self.host_env = dict(host_env)
        self.env = {**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0", "SGLANG_CACHE_DIR": str(run_dir / "cache")}
        self.env |= {"PYTHONUNBUFFERED": "1", **self.host_env}
        self.argv = [
            sys.executable if a == f"{venv}/bin/python" else a.replace(release, str(run_dir))
            for a in rendered.exec_start
        ]
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.rendered_env = env

    def start(self) -> None:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self) -> None:
        stop_all([self])

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_text(self, start: int = 0, end: int | None = None) -> str:
        """The log's bytes [start, end) as text (a cut mid-line leaves a fragment the parsers skip)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(start)
            data = f.read(-1 if end is None else max(0, end - start))
        return data.decode("utf-8", errors="replace")


def stop_all(servers: list[Server], grace: float = 10.0) -> None:
    """SIGTERM to every server's process group at once, then SIGKILL to what is left after `grace` seconds (a run
    cut at its time limit must not spend it waiting for servers one by one)."""
    running = [s.proc for s in servers if s.proc is not None and s.proc.poll() is None]
    for proc in running:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_all(servers: list[Server]) -> None:
    """Every server at once. SGLang sizes its KV pool as the free memory now minus (1 - mem_fraction_static) of
    the free memory it saw at start, so servers that start together all count on the same free memory: with a
    small fraction the later ones find none left ("Not enough memory", docs/sglang.md). A large fraction with
    an explicit pool size (`host_args`) leaves every server room and keeps what each takes small."""
    for s in servers:
        s.start()


def wait_healthy(servers: list[Server], base: dict[str, str], timeout: float) -> dict[str, str]:
    import httpx

    status = {s.name: "starting" for s in servers}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "starting" in status.values():
        for s in servers:
            if status[s.name] != "starting":
                continue
            if s.proc is not None and s.proc.poll() is not None:
                status[s.name] = f"exited {s.proc.returncode}"
                continue
            try:
                if httpx.get(f"{base[s.name]}/health", timeout=2).status_code == 200:
                    status[s.name] = "ok"
                    print(f"{s.name}: healthy", flush=True)
            except httpx.HTTPError:
                pass
        time.sleep(1)
    return {k: ("timeout" if v == "starting" else v) for k, v in status.items()}


def probe(servers: list[Server], base: dict[str, str], health: dict[str, str]) -> dict[str, str]:
    """A first request (a prefill through the radix cache): a server that dies or errors on it is not ok."""
    out = dict(health)
    for s in servers:
        if out[s.name] != "ok":
            continue
        try:
            generate(base[s.name], "def main():\n", 8, False)
        except Exception as exc:  # any failure of the first request is the finding, written to the JSON
            out[s.name] = f"first request failed: {type(exc).__name__}"
        time.sleep(0.5)
        if s.proc is not None and s.proc.poll() is not None:
            out[s.name] = f"exited {s.proc.returncode} after the first request"
        print(f"{s.name}: first request {out[s.name]}", flush=True)
    return out


def generate(base: str, prompt: str | list[int], new_tokens: int, logprobs: bool) -> dict[str, Any]:
    """Greedy /generate of a text or of token ids (ids: the greedy check appends a common prefix exactly)."""
    import httpx

    body: dict[str, Any] = {"input_ids" if isinstance(prompt, list) else "text": prompt}
    body["sampling_params"] = {"temperature": 0, "max_new_tokens": new_tokens}
    if logprobs:
        # top-5: at a 3-way bf16 tie the service's token may be the third
        body |= {"return_logprob": True, "top_logprobs_num": 5, "return_text_in_logprobs": True}
    response = httpx.post(f"{base}/generate", json=body, timeout=300)
    response.raise_for_status()
    out: dict[str, Any] = response.json()
    return out


def output_ids(res: dict[str, Any]) -> list[int]:
    if "output_ids" in res:
        return [int(t) for t in res["output_ids"]]
    return [int(t[1]) for t in res["meta_info"]["output_token_logprobs"]]


def ranked_top(res: dict[str, Any]) -> list[list[list[Any]]]:
    """Per output position: the top logprobs as [[logprob, id, text], ...], best first (text None if absent)."""
    out = []
    for pos in res["meta_info"].get("output_top_logprobs") or []:
        entries = [[float(e[0]), int(e[1]), e[2] if len(e) > 2 else None] for e in pos if e[0] is not None]
        out.append(sorted(entries, key=lambda e: -e[0]))
    return out


def top2_gap(ranked: list[list[Any]]) -> float | None:
    return round(ranked[0][0] - ranked[1][0], 4) if len(ranked) > 1 else None


def gap_to(ranked: list[list[Any]], token: int) -> float | None:
    """The baseline's best logprob minus its logprob of `token` (None when `token` is not in its top list)."""
    mine = next((e[0] for e in ranked if e[1] == token), None)
    return None if mine is None else round(ranked[0][0] - mine, 4)  # a match means `ranked` is not empty


def first_difference(
    ref: list[int], out: list[int], ref_top: list[list[list[Any]]], margin: float
) -> tuple[str, int | None]:
    """-> (row, position): "equal"; "tie@P(gap)" when, at the first difference P, the token the service took is
    within `margin` of the baseline's best logprob (its gap to it shown; at an exact tie 0.000, whichever
    order SGLang listed the tied tokens in); else "DIFF@P" (P: the shorter length when one output is a prefix
    of the other)."""
    at = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b), None)
    if at is None:
        return ("equal", None) if len(ref) == len(out) else (f"DIFF@{min(len(ref), len(out))}", None)
    gap = gap_to(ref_top[at], out[at]) if at < len(ref_top) else None
    if gap is not None and gap < margin:
        return f"tie@{at}({gap:.3f})", at
    return f"DIFF@{at}", at


def difference_record(
    index: int, row: str, at: int, ref: list[int], out: list[int], ref_top: list[list[list[Any]]], svc_top: Any
) -> dict[str, Any]:
    """What the JSON keeps of one first difference: the baseline's top-2 there (its own decode), the token the
    service emitted, and the service's top-2 at the same position, re-scored by a one-token request on the
    service over prompt + the common prefix (a prefill, not the verify forward that chose the token: a request
    with logprobs takes DFLASH's chain, so a tree's own verify logits cannot be read over HTTP)."""
    top = ref_top[at][:2] if at < len(ref_top) else []
    rec: dict[str, Any] = {
        "prompt": index,
        "at": at,
        "verdict": row.split("@")[0],
        "base_token": ref[at],
        "svc_token": out[at],
        "base_top2": top,
        "base_gap": top2_gap(top),
    }
    if isinstance(svc_top, str):
        rec["svc_error"] = svc_top
    else:
        rec["svc_top2"] = svc_top[:2]
        rec["svc_gap"] = top2_gap(svc_top)
    return rec


def rescore(url: str, prompt_ids: list[int], prefix: list[int]) -> list[list[Any]] | str:
    """The server's top-2 for the token after prompt + prefix (or the error, as text)."""
    try:
        ranked = ranked_top(generate(url, prompt_ids + prefix, 1, True))
        return ranked[0] if ranked else "no top logprobs in the answer"
    except Exception as exc:  # a failed re-score is recorded, the check goes on
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def greedy_check(
    base_url: str, urls: dict[str, str], prompts: list[list[int]], new_tokens: int, margin: float, parallel: int
) -> dict[str, Any]:
    """Every prompt (token ids) through the baseline with logprobs, then through every service at once (no
    timing is taken here; `parallel` requests in flight per service, so the tree's batch sizes up to it run,
    and capture their round graphs, before the levels)."""
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(parallel) as pool:
        refs = list(pool.map(lambda t: generate(base_url, t, new_tokens, True), prompts))
    ref_ids = [output_ids(r) for r in refs]
    ref_tops = [ranked_top(r) for r in refs]

    def one(url: str) -> dict[str, Any]:
        with cf.ThreadPoolExecutor(parallel) as pool:
            outs = list(pool.map(lambda t: output_ids(generate(url, t, new_tokens, False)), prompts))
        rows, firsts = [], []
        for i, (ref, top, out) in enumerate(zip(ref_ids, ref_tops, outs, strict=True)):
            row, at = first_difference(ref, out, top, margin)
            rows.append(row)
            if at is not None:
                svc_top = rescore(url, prompts[i], out[:at])
                rec = difference_record(i, row, at, ref, out, top, svc_top)
                # the baseline's whole top-5 there and the service token's gap to its best: a 3-way tie shows
                rec["base_top5"] = top[at][:5] if at < len(top) else []
                rec["svc_token_gap"] = gap_to(top[at], out[at]) if at < len(top) else None
                firsts.append(rec)
        return {
            "equal": rows.count("equal"),
            "ties": sum(r.startswith("tie") for r in rows),
            "diffs": sum(r.startswith("DIFF") for r in rows),
            "rows": rows,
            "firsts": firsts,
        }

    with cf.ThreadPoolExecutor(max(1, len(urls))) as services:
        futures = {name: services.submit(one, url) for name, url in urls.items()}
        verdicts: dict[str, Any] = {}
        for name, fut in futures.items():
            try:
                verdicts[name] = v = fut.result()
            except Exception as exc:  # one service's failure is its finding; the others keep theirs
                verdicts[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                continue
            print(f"greedy {name} vs baseline: {v['equal']} equal, {v['ties']} near-ties, {v['diffs']} differ")
    return verdicts


PHASES = ("tau", "nodes", "depth", "width", "off_spine", "draft_ms", "build_ms", "verify_ms", "commit_ms", "tok_s")


def _mean(values: list[float], weights: list[float] | None = None) -> float | None:
    if not values:
        return None
    w = weights or [1.0] * len(values)
    total = sum(w)
    return round(sum(v * x for v, x in zip(values, w, strict=True)) / total, 3) if total > 0 else None


def last_metrics_rounds(text: str) -> int | None:
    """The `rounds` counter of the last `DDTREE metrics` line in `text` (None: none there)."""
    from opsctl.metrics import DDTreeMetrics, parse_ddtree

    rounds = None
    for line in text.splitlines():
        if "DDTREE metrics" in line and isinstance(rec := parse_ddtree(line), DDTreeMetrics):
            rounds = rec.rounds
    return rounds


def summarize_window(text: str, rounds_before: int | None = None) -> dict[str, Any]:
    """One level's slice of a server log -> the compact summary kept in the JSON. `DDTREE metrics` fields are
    means over the slice's lines, weighted by each line's rounds (its `rounds` minus the previous line's; the
    first line's previous is `rounds_before`, or it weighs as much as the mean of the others); `Decode batch`
    lines give count, mean running requests, mean generation throughput, mean accept length and the fraction
    that ran a CUDA graph; `DDTREE policy` lines are kept as written. Missing lines give None / 0, never an
    error: a level may be too short for a line, baseline and linear print no DDTREE lines."""
    from opsctl.metrics import DDTreeMetrics, DecodeBatch, Malformed, parse_line

    metrics: list[DDTreeMetrics] = []
    decode: list[DecodeBatch] = []
    switches: list[str] = []
    notes: list[str] = []
    malformed = 0
    for line in text.splitlines():
        if "DDTREE policy " in line:
            switches.append(line[line.index("DDTREE policy ") + len("DDTREE policy ") :].strip()[:200])
            continue
        if ("DDTREE" in line and ("WARNING" in line or "FAILED" in line or "fall" in line)) or "Traceback" in line:
            notes.append(line.strip()[-300:])
        if "DDTREE metrics" not in line and "Decode batch" not in line:
            continue  # other DDTREE lines (init, self-check, notes) are no records here, not malformed ones
        rec = parse_line(line)
        if isinstance(rec, DDTreeMetrics):
            metrics.append(rec)
        elif isinstance(rec, DecodeBatch):
            decode.append(rec)
        elif isinstance(rec, Malformed):
            malformed += 1
    deltas: list[float | None] = []
    prev = rounds_before
    for m in metrics:
        deltas.append(float(m.rounds - prev) if prev is not None and m.rounds >= prev else None)
        prev = m.rounds
    known = [d for d in deltas if d is not None]
    fill = sum(known) / len(known) if known else 1.0
    weights = [d if d is not None else fill for d in deltas]
    ddtree: dict[str, Any] = {"lines": len(metrics)}
    if metrics:
        for key in PHASES:
            vals = [float(getattr(m, key) if key != "width" else m.extra.get("width", "nan")) for m in metrics]
            pairs = [(v, w) for v, w in zip(vals, weights, strict=True) if v == v]  # width: absent on old lines
            ddtree[key] = _mean([v for v, _ in pairs], [w for _, w in pairs])
        phases = [ddtree[k] for k in ("draft_ms", "build_ms", "verify_ms", "commit_ms")]
        ddtree["round_ms"] = round(sum(phases), 3) if None not in phases else None
        ddtree["rounds"] = int(sum(known)) if known else None
        last = metrics[-1].policy
        if last is not None:
            ddtree["policy"] = {"shape": last.shape, "choice": last.describe(), "switches": last.switches}
    graphs = [d.graph for d in decode if d.graph is not None]
    accepts = [d.accept_len for d in decode if d.accept_len is not None]
    return {
        "ddtree": ddtree,
        "decode": {
            "lines": len(decode),
            "running_req": _mean([float(d.running_req) for d in decode]),
            "gen_tok_s": _mean([d.gen_throughput for d in decode]),
            "accept_len": _mean(accepts),
            "cuda_graph": _mean([1.0 if g else 0.0 for g in graphs]),  # fraction of lines with `cuda graph: True`
        },
        "policy_switches": switches[:20],
        "notes": notes[:5],
        "malformed": malformed,
    }


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheels", type=Path, default=REPO / ".cache" / "pairs" / "wheels")
    p.add_argument("--cache", type=Path, default=Path("/tmp/pairs"))
    p.add_argument("--scale", default="gpu", help="ddtree.pairs build scale (ci: seconds on a CPU, learns nothing)")
    p.add_argument("--device", default="cuda", help="where the pairs are built")
    p.add_argument("--dry-run", action="store_true", help="build, render and write the JSON; start no server")
    p.add_argument("--budgets", type=int_list, default=[15], help="plain tree services")
    p.add_argument("--policy-budgets", type=int_list, default=[15], help="tree-policy services")
    p.add_argument("--rg-budgets", type=int_list, default=[15], help="dense tree with --rg-max-bs")
    p.add_argument("--rg-max-bs", type=int, default=32, help="DDTREE_ROUND_GRAPHS_MAX_BS of the rg services")
    p.add_argument("--decode-log-interval", type=int, default=10, help="SGLang's, every service alike")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--pairs", default="dense,hybrid")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16, 32])
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts per level (requests: max(this, 2c))")
    p.add_argument("--check-prompts", type=int, default=32, help="held-out prompts of the greedy check")
    p.add_argument("--check-parallel", type=int, default=32, help="greedy check: requests in flight per service")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--mem-fraction", type=float, default=0.85)
    p.add_argument("--max-total-tokens", type=int, default=131072, help="KV pool tokens per server")
    p.add_argument("--radix-core", default="python", help="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND ('' = SGLang's)")
    p.add_argument("--rust-probe", type=int, default=0, help="1: also a dense baseline on SGLang's Rust core")
    p.add_argument("--tie-margin", type=float, default=0.5)
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--start-timeout", type=float, default=180)
    p.add_argument("--level-timeout", type=float, default=60, help="seconds one request of a level may take")
    p.add_argument("--deadline", type=float, default=520, help="seconds from start: later levels are skipped")
    p.add_argument("--json", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "pairs_bench.json")
    args = p.parse_args()
    out_dir = args.json.parent
    log_dir = Path("/tmp/pairs_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "skipped": [], "stage": "start"}

    def save(stage: str) -> None:  # partial results as they come: a run cut at its limit still returns data
        result["stage"], result["elapsed_s"] = stage, round(time.monotonic() - t0, 1)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"[{result['elapsed_s']:.0f}s] {stage}", flush=True)

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(f"signal {signum}")  # run the finally below: stop the servers, write what was measured

    signal.signal(signal.SIGTERM, on_term)

    # the stand-in's sitecustomize and gpu_patches load these; without them no stand-in patch applies
    standin_needs = [REPO / "tests/runtime/sglang_cpu.py", REPO / "tests/runtime/sglang_engine/engine_patches.py"]
    missing = [str(f) for f in standin_needs if not f.is_file()]
    if not args.dry_run and os.environ.get("SGLANG_GPU_STANDIN", "1") == "1" and missing:
        raise SystemExit(f"{', '.join(missing)} missing: carry them (the stand-in's patches load them; docs)")

    from opsctl.bench.load import bench_levels, level_json
    from opsctl.bench.prompts import BenchPrompt
    from opsctl.inventory.load import load_inventory
    from opsctl.render import render_service

    servers: list[Server] = []
    services: list[Any] = []
    hosts: dict[str, Any] = {}  # service name -> its inventory's host
    base: dict[str, str] = {}
    result["rendered"] = {}
    specs = {s.name: s for s in service_plan(args.pairs.split(","), args)}

    def launch(pair: str, build: dict[str, Any]) -> None:
        """Render this pair's inventory and start its services (not in a dry run)."""
        inv_path = log_dir / f"inventory-{pair}.yaml"
        inv_path.write_text(inventory_yaml({pair: build}, list(specs.values()), args))
        host = load_inventory(inv_path).hosts[0]
        started = []
        for svc in host.services:
            rendered = render_service(host, svc, "h200")
            run_dir = Path("/tmp/pairs_run") / svc.name
            srv = Server(svc.name, rendered, host.venv, run_dir, log_dir, specs[svc.name].host_env)
            servers.append(srv)
            services.append(svc)
            hosts[svc.name] = host
            base[svc.name] = f"http://127.0.0.1:{svc.port}"
            result["rendered"][svc.name] = {
                "exec_start": srv.argv,
                "flags": list(rendered.flags),
                "env": srv.rendered_env,
                "host_env": srv.host_env,  # set here, outside the inventory (ServiceSpec.host_env)
                "variant": specs[svc.name].variant,
            }
            started.append(srv)
        if not args.dry_run:
            start_all(started)
        save(f"rendered {pair}{'' if args.dry_run else ', servers starting'}")

    try:
        t1 = time.monotonic()
        names = args.pairs.split(",")
        pairs = build_pairs(args.wheels, args.cache, log_dir, names, args.scale, args.device, launch)
        result["builds"] = pairs
        result["build_s"] = round(time.monotonic() - t0, 1)
        save("built")
        if args.dry_run:
            return 0
        health = wait_healthy(servers, base, args.start_timeout)
        health = probe(servers, base, health)
        result["health_first"] = dict(health)
        rust = next((s for s in servers if s.name == "dense-rustcore"), None)
        if rust is not None:
            rust.stop()
            log = rust.log_path.read_text(errors="replace")
            result["rust_core"] = {
                "health": health.pop(rust.name),
                "panic": [ln[-400:] for ln in log.splitlines() if "panicked" in ln or "UnknownKind" in ln][:3],
            }
            servers.remove(rust)
            services = [svc for svc in services if svc.name != rust.name]
        retry = [s for s in servers if health[s.name] != "ok"]
        if retry:  # once more without the radix cache, so the table has the mode; the JSON says which
            stop_all(retry)
            for s in retry:
                s.argv.append("--disable-radix-cache")
            start_all(retry)
            health |= probe(retry, base, wait_healthy(retry, base, args.start_timeout))
            result["radix_off"] = [s.name for s in retry]
        result["health"], result["start_s"] = health, round(time.monotonic() - t1, 1)
        save("started")
        import concurrent.futures as cf

        from ddtree.tiny import chat_prompt_ids
        from transformers import AutoTokenizer

        def check(pair: str, build: dict[str, Any]) -> dict[str, Any] | None:
            tok = AutoTokenizer.from_pretrained(f"{build['dir']}/target")
            held = json.loads(Path(build["dir"], "heldout.json").read_text())[: args.check_prompts]
            prompts = [chat_prompt_ids(tok, u, False) for u in held]
            spec = {
                s.name: base[s.name]
                for s in services
                if s.name.startswith(f"{pair}-") and s.mode.speculative and health[s.name] == "ok"
            }
            if health.get(f"{pair}-base") != "ok" or not spec:
                return None
            try:
                return greedy_check(
                    base[f"{pair}-base"], spec, prompts, args.max_tokens, args.tie_margin, args.check_parallel
                )
            except Exception as exc:  # a failed request is a finding: written, the benchmark goes on
                return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}

        result["greedy"] = {}
        with cf.ThreadPoolExecutor(len(pairs)) as pool:  # both pairs at once: no timing is taken here
            checks = {pair: pool.submit(check, pair, build) for pair, build in pairs.items()}
            for pair, fut in checks.items():
                if (verdict := fut.result()) is not None:
                    result["greedy"][pair] = verdict
        save("greedy")
        result["levels"] = {}
        # every service greedy first, then every service at temperature 1: a run cut short keeps whole greedy rows
        server_of = {srv.name: srv for srv in servers}
        for temp in sorted({t for sp in specs.values() for t in sp.temperatures}):
            for svc in services:
                if health[svc.name] != "ok" or temp not in specs[svc.name].temperatures:
                    continue
                if time.monotonic() - t0 > args.deadline:
                    result["skipped"].append(f"{svc.name}@t{temp:g}")
                    continue
                pair = svc.name.split("-")[0]
                held = json.loads(Path(pairs[pair]["dir"], "heldout.json").read_text())
                bench_prompts = [BenchPrompt(f"h{i}", "heldout", t) for i, t in enumerate(held[-args.prompts :])]
                srv = server_of[svc.name]
                marks = [srv.log_size()]  # the log's size as each level ends: level i is marks[i]..marks[i + 1]

                def mark(msg: str, srv: Server = srv, marks: list[int] = marks) -> None:
                    marks.append(srv.log_size())
                    print(msg, flush=True)

                try:
                    levels = bench_levels(
                        hosts[svc.name],
                        svc,
                        bench_prompts,
                        args.concurrency,
                        1,
                        args.max_tokens,
                        temp,
                        timeout_s=args.level_timeout,
                        progress=mark,
                    )
                except Exception as exc:  # one line per failed service, the others still measured
                    result.setdefault("errors", {})[f"{svc.name}@t{temp:g}"] = f"{type(exc).__name__}: {exc}"[:400]
                    print(f"{svc.name}@t{temp:g}: {type(exc).__name__}: {exc}"[:400], flush=True)
                    continue
                result["levels"][f"{svc.name}@t{temp:g}"] = {
                    "service": svc.name,
                    "pair": pair,
                    "mode": svc.mode.value,
                    "temperature": temp,
                    "budget": svc.ddtree.budget if svc.mode.ddtree else None,
                    "eager": "--disable-cuda-graph" in result["rendered"][svc.name]["flags"],
                    "variant": specs[svc.name].variant,
                    "levels": [level_json(r, len(svc.gpus)) for r in levels],
                }
                rounds = last_metrics_rounds(srv.log_text(0, marks[0]))
                for i, lv in enumerate(result["levels"][f"{svc.name}@t{temp:g}"]["levels"]):
                    # the first level's slice also holds bench_levels' one warm-up request
                    lv["log"] = summarize_window(srv.log_text(marks[i], marks[i + 1]), rounds)
                    rounds = last_metrics_rounds(srv.log_text(marks[i], marks[i + 1])) or rounds
                save(f"levels {svc.name}@t{temp:g}")
    except BaseException as exc:  # the finding goes into the JSON; the exit status still says it failed
        result["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
        raise
    finally:
        result["total_s"] = round(time.monotonic() - t0, 1)
        save(result["stage"] + " (final)")
        with tarfile.open(out_dir / "pairs_logs.tar.gz", "w:gz") as tar:
            tar.add(log_dir, arcname="pairs_logs")
        stop_all(servers)
    failed = [k for k, v in result.get("health", {}).items() if v != "ok"]
    diffs = [k for g in result.get("greedy", {}).values() for k, v in g.items() if isinstance(v, dict) and v["diffs"]]
    print(f"done in {result['total_s']}s; failed services: {failed or 'none'}; greedy diffs: {diffs or 'none'}")
    return 1 if failed or diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
