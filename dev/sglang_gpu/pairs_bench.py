"""Issue 28 on the GPU host: the small pairs trained on real text, served the way opsctl renders them, measured
per mode against concurrency with `opsctl bench`'s own code.

Run through `bash dev/sglang_gpu/run.sh pairs` (SGLang's wheels, the runtime and the stand-in set up). Steps:
1. builds or reuses both pairs (`python -m ddtree.pairs build --device cuda`, the two at once) from the corpus
   wheels in `--wheels`;
2. writes an inventory (host 127.0.0.1, one service per pair and mode: baseline, linear, tree at each
   `--budgets`), renders it with `opsctl.render`, and starts every service by hand (no systemd here): its
   rendered ExecStart with the rendered EnvironmentFile, the venv's python and the release dir swapped for this
   host's, all services at once on the one GPU (`--mem-fraction`);
3. greedy check: every held-out prompt through each speculative service's native /generate, compared with the
   baseline's tokens; a first difference is a near-tie when the baseline's top-2 logprob gap there is below
   `--tie-margin` (bf16) and the service took the baseline's runner-up;
4. `opsctl.bench.load.bench_levels` (what `opsctl bench --concurrency` runs) per service, one service at a time,
   at temperature 0 and 1;
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
from collections.abc import Callable
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


def inventory_yaml(pairs: dict[str, dict[str, Any]], budgets: list[int], args: argparse.Namespace) -> str:
    # opsctl gives each service its own GPUs (the loader refuses sharing); here they all run on the one GPU
    # (Server overrides CUDA_VISIBLE_DEVICES), which a production host would not do
    lines = ["hosts:", "  h200:", "    address: 127.0.0.1", "    gpus: 64", "    services:"]
    first = list(ARCHES).index(next(iter(pairs)))  # one inventory per pair: ports and GPU indices apart
    port, gpu = args.port + 16 * first, 16 * first
    for pair, build in pairs.items():
        d = build["shm_dir"]
        hybrid = "true" if pair == "hybrid" else "false"
        modes = [("base", "baseline", None), ("linear", "linear", None)]
        modes += [(f"tree{b}", "tree", b) for b in budgets]
        for short, mode, budget in modes:
            lines += [
                f"      {pair}-{short}:",
                f"        gpus: [{gpu}]",
                f"        port: {port}",
                f"        mode: {mode}",
                f"        model: {{source: {d}/target, source_on: host, path: {d}/target, hybrid: {hybrid}}}",
            ]
            if mode != "baseline":
                lines.append(f"        draft_model: {{source: {d}/draft, source_on: host, path: {d}/draft}}")
            if budget is not None:
                lines.append(f"        ddtree: {{budget: {budget}, topk: {args.topk}}}")
            lines.append(f"        extra_args: {json.dumps(host_args(mode, pair == 'hybrid', args))}")
            if args.radix_core:
                lines.append(f"        extra_env: {{SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: {args.radix_core}}}")
            port, gpu = port + 1, gpu + 1
    if args.rust_probe and "dense" in pairs:  # SGLang's default radix TreeCore (Rust), to see it crash or not
        d = pairs["dense"]["shm_dir"]
        lines += [
            "      dense-rustcore:",
            f"        gpus: [{gpu}]",
            f"        port: {port}",
            "        mode: baseline",
            f"        model: {{source: {d}/target, source_on: host, path: {d}/target, hybrid: false}}",
            f"        extra_args: {json.dumps(host_args('baseline', False, args))}",
        ]
    return "\n".join(lines) + "\n"


def host_args(mode: str, hybrid: bool, args: argparse.Namespace) -> list[str]:
    """What this host adds to the rendered flags: SGLang's flashinfer samplers and FA3 are absent (the torch
    stand-in), several servers share the one GPU; baseline and linear get the backend, page size and schedule
    opsctl renders for tree, so every arm agrees on them (opsctl bench's bias keys)."""
    extra = ["--sampling-backend", "pytorch", "--mem-fraction-static", str(args.mem_fraction)]
    extra += ["--max-total-tokens", str(args.max_total_tokens), "--max-running-requests", str(max(args.concurrency))]
    extra += ["--cuda-graph-max-bs-decode", "32", "--skip-server-warmup"]
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
    def __init__(self, name: str, rendered: Any, venv: str, run_dir: Path, log_dir: Path) -> None:
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
        self.env = {**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0", "SGLANG_CACHE_DIR": str(run_dir / "cache")}
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


def generate(base: str, text: str, new_tokens: int, logprobs: bool) -> dict[str, Any]:
    import httpx

    body: dict[str, Any] = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens}}
    if logprobs:
        body |= {"return_logprob": True, "top_logprobs_num": 2}
    response = httpx.post(f"{base}/generate", json=body, timeout=300)
    response.raise_for_status()
    out: dict[str, Any] = response.json()
    return out


def output_ids(res: dict[str, Any]) -> list[int]:
    if "output_ids" in res:
        return [int(t) for t in res["output_ids"]]
    return [int(t[1]) for t in res["meta_info"]["output_token_logprobs"]]


def top2(res: dict[str, Any]) -> list[tuple[float, int | None]]:
    """Per position: (top-1 minus top-2 logprob, the runner-up's id)."""
    out: list[tuple[float, int | None]] = []
    for pos in res["meta_info"].get("output_top_logprobs") or []:
        ranked = sorted(((float(lp), int(tid)) for lp, tid, *_ in pos if lp is not None), reverse=True)
        out.append((ranked[0][0] - ranked[1][0], ranked[1][1]) if len(ranked) > 1 else (float("inf"), None))
    return out


def greedy_check(
    base_url: str, urls: dict[str, str], texts: list[str], new_tokens: int, margin: float
) -> dict[str, Any]:
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(16) as pool:
        refs = list(pool.map(lambda t: generate(base_url, t, new_tokens, True), texts))
        ref_ids = [output_ids(r) for r in refs]
        gaps = [top2(r) for r in refs]
        verdicts: dict[str, Any] = {}
        for name, url in urls.items():
            outs = list(pool.map(lambda t, u=url: output_ids(generate(u, t, new_tokens, False)), texts))
            rows = []
            for ref, gap, out in zip(ref_ids, gaps, outs, strict=True):
                at = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b), None)
                if at is None and len(ref) == len(out):
                    rows.append("equal")
                elif at is not None and at < len(gap) and gap[at][0] < margin and out[at] == gap[at][1]:
                    rows.append(f"tie@{at}({gap[at][0]:.3f})")
                else:
                    rows.append(f"DIFF@{at if at is not None else min(len(ref), len(out))}")
            verdicts[name] = {
                "equal": rows.count("equal"),
                "ties": sum(r.startswith("tie") for r in rows),
                "diffs": sum(r.startswith("DIFF") for r in rows),
                "rows": rows,
            }
            print(
                f"greedy {name} vs baseline: {verdicts[name]['equal']} equal, {verdicts[name]['ties']} "
                f"near-ties, {verdicts[name]['diffs']} differ",
                flush=True,
            )
    return verdicts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheels", type=Path, default=REPO / ".cache" / "pairs" / "wheels")
    p.add_argument("--cache", type=Path, default=Path("/tmp/pairs"))
    p.add_argument("--scale", default="gpu", help="ddtree.pairs build scale (ci: seconds on a CPU, learns nothing)")
    p.add_argument("--device", default="cuda", help="where the pairs are built")
    p.add_argument("--dry-run", action="store_true", help="build, render and write the JSON; start no server")
    p.add_argument("--budgets", default="7,15")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--pairs", default="dense,hybrid")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16, 32])
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts per level (requests: max(this, 2c))")
    p.add_argument("--check-prompts", type=int, default=32, help="held-out prompts of the greedy check")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--mem-fraction", type=float, default=0.85)
    p.add_argument("--max-total-tokens", type=int, default=131072, help="KV pool tokens per server")
    p.add_argument("--radix-core", default="python", help="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND ('' = SGLang's)")
    p.add_argument("--rust-probe", type=int, default=1, help="also start a dense baseline on SGLang's Rust core")
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
    budgets = [int(b) for b in args.budgets.split(",")]

    def launch(pair: str, build: dict[str, Any]) -> None:
        """Render this pair's inventory and start its services (not in a dry run)."""
        inv_path = log_dir / f"inventory-{pair}.yaml"
        inv_path.write_text(inventory_yaml({pair: build}, budgets, args))
        host = load_inventory(inv_path).hosts[0]
        started = []
        for svc in host.services:
            rendered = render_service(host, svc, "h200")
            srv = Server(svc.name, rendered, host.venv, Path("/tmp/pairs_run") / svc.name, log_dir)
            servers.append(srv)
            services.append(svc)
            hosts[svc.name] = host
            base[svc.name] = f"http://127.0.0.1:{svc.port}"
            result["rendered"][svc.name] = {
                "exec_start": srv.argv,
                "flags": list(rendered.flags),
                "env": srv.rendered_env,
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
        from transformers import AutoTokenizer

        result["greedy"] = {}
        for pair, build in pairs.items():
            tok = AutoTokenizer.from_pretrained(f"{build['dir']}/target")
            prompts = json.loads(Path(build["dir"], "heldout.json").read_text())
            chat = [
                tok.apply_chat_template(
                    [{"role": "user", "content": u}], tokenize=False, add_generation_prompt=True, enable_thinking=False
                )
                for u in prompts[: args.check_prompts]
            ]
            spec = {
                s.name: base[s.name]
                for s in services
                if s.name.startswith(f"{pair}-") and s.mode.speculative and health[s.name] == "ok"
            }
            if health.get(f"{pair}-base") == "ok" and spec:
                try:
                    result["greedy"][pair] = greedy_check(
                        base[f"{pair}-base"], spec, chat, args.max_tokens, args.tie_margin
                    )
                except Exception as exc:  # a failed request is a finding: written, the benchmark goes on
                    result["greedy"][pair] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            save(f"greedy {pair}")
        result["levels"] = {}
        # every service greedy first, then every service at temperature 1: a run cut short keeps whole greedy rows
        for temp in [float(t) for t in args.temperatures.split(",")]:
            for svc in services:
                if health[svc.name] != "ok":
                    continue
                if time.monotonic() - t0 > args.deadline:
                    result["skipped"].append(f"{svc.name}@t{temp:g}")
                    continue
                pair = svc.name.split("-")[0]
                held = json.loads(Path(pairs[pair]["dir"], "heldout.json").read_text())
                bench_prompts = [BenchPrompt(f"h{i}", "heldout", t) for i, t in enumerate(held[-args.prompts :])]
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
                        progress=lambda m: print(m, flush=True),
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
                    "levels": [level_json(r, len(svc.gpus)) for r in levels],
                }
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
