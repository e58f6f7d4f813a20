"""Request kinds on a GPU: SGLang's baseline and DDTREE's tree round on CUDA, every request kind a tree
round serves, token for token.

`bash dev/sglang_gpu/run.sh kinds [flags]` (SGLang's wheels, the runtime and the stand-in set up); the tiny pairs
and transformers' references come from `.cache/sglang_gpu` (dev/sglang_gpu/prepare.sh, on a CPU first).

Per model (dense float32, hybrid bfloat16; head_dim 32), four Engines with seeded sampling on
(`enable_deterministic_inference`, SGLang's pytorch sampler): baseline and tree, each with CUDA graphs (what
opsctl renders) and without. Each decodes four batches (`ignore_eos`, `--new-tokens` each):
- "kinds": one request of each KINDS entry, batched (greedy rows with logit_bias, each penalty and
  min_new_tokens; seeded sampled rows at temperature 0.6-1.0 with and without top-k / top-p / min-p; a plain
  greedy row), every request returning its log-probs and top `--top-logprobs`;
- "alone": the Qwen3-recommended sampled kind alone;
- "mixed": three greedy rows beside three seeded rows at temperature 0.6, top-p 0.95;
- "sampled": six seeded rows at temperature 1.0.
Verdicts: every tree request's tokens equal the baseline's with the same graphs setting, log-probs within
`--logprob-tolerance`, the tree runs logged tree rounds (DDTREE metrics lines) and never "take DFLASH's chain
verify", and no self-check failed. Exit status 1 on any difference or failed run. The JSON (`--json`) holds every
request's tokens, the verdicts and each run's DDTREE lines.

Rehearse on a CPU (no SGLang): `--dry-run` prints the Engines' arguments and the batches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402  (beside this file)

# (name, sampling parameters); no min_p beside a seed: SGLang 0.5.23's pytorch sampler asserts against that pair
# and the assertion takes the scheduler down (docs/sglang.md, "Request kinds"). "BAN" and "EOS" are replaced per
# model (the reference's 4th greedy token of the first prompt; the tokenizer's EOS)
KINDS: list[tuple[str, dict[str, Any]]] = [
    (
        "greedy, logit_bias bans the 4th greedy token, frequency 1.5",
        {"logit_bias": {"BAN": -100.0}, "frequency_penalty": 1.5},
    ),
    ("greedy, presence 0.8, repetition 1.3", {"presence_penalty": 0.8, "repetition_penalty": 1.3}),
    ("greedy, EOS pushed up, min_new_tokens 16", {"logit_bias": {"EOS": 30.0}, "min_new_tokens": 16}),
    (
        "seeded, T 0.6, top_p 0.95, top_k 20 (Qwen3's)",
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "sampling_seed": 11},
    ),
    ("seeded, T 0.7, top_p 0.8", {"temperature": 0.7, "top_p": 0.8, "sampling_seed": 12}),
    ("seeded, T 1.0", {"temperature": 1.0, "sampling_seed": 13}),
    (
        "seeded, T 1.0, top_k 50, frequency 0.5",
        {"temperature": 1.0, "top_k": 50, "frequency_penalty": 0.5, "sampling_seed": 14},
    ),
    ("greedy", {}),
]
# grammar-constrained requests (one vocabulary mask per tree node), decoded last and only by the Engines without
# CUDA graphs: a grammar backend failure then costs no other verdict. ignore_eos off: with it on, SGLang's
# non-speculative decode emits one token after the grammar completes, every speculative round none.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
GRAMMARS = {
    "regex": {"regex": "[a-z ]+", "ignore_eos": False},
    "json": {"json_schema": json.dumps(PERSON_SCHEMA), "ignore_eos": False},
}
ALONE = 3  # KINDS index decoded alone
MODES = ("baseline", "tree", "baseline-eager", "tree-eager")
DETERMINISTIC = {"enable_deterministic_inference": True, "sampling_backend": "pytorch"}
DFLASH_ROUND = "take DFLASH's chain verify"
SELFCHECK_FAILED = "self-check FAILED"


def kinds_for(pair: Path, reference: list[harness.Reference]) -> list[dict[str, Any]]:
    """KINDS' sampling parameters with BAN and EOS filled in for this pair."""
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(pair / "target").eos_token_id
    fill = {"BAN": str(reference[0].tokens[3]), "EOS": str(eos)}
    out = []
    for _, params in KINDS:
        p = dict(params)
        if "logit_bias" in p:
            p["logit_bias"] = {fill.get(k, k): v for k, v in p["logit_bias"].items()}
        out.append(p)
    return out


def batches_for(
    ids: list[list[int]], kinds: list[dict[str, Any]]
) -> tuple[list[list[list[int]]], list[str], dict[str, list[dict[str, Any]]]]:
    """(batches, their names, per-batch sampling overrides) of one model."""
    n = len(ids)
    mixed = [{}, {}, {}] + [{"temperature": 0.6, "top_p": 0.95, "sampling_seed": 100 + i} for i in range(3)]
    sampled = [{"temperature": 1.0, "sampling_seed": 200 + i} for i in range(n)]
    batches = [[ids[i % n] for i in range(len(kinds))], [ids[ALONE % n]], ids[:6], ids]
    overrides = {"0": kinds, "1": [kinds[ALONE]], "2": mixed, "3": sampled}
    return batches, ["kinds", "alone", "mixed", "sampled"], overrides


def with_grammar(
    batches: list[list[list[int]]],
    names: list[str],
    overrides: dict[str, list[dict[str, Any]]],
    ids: list[list[int]],
    grammars: list[dict[str, Any]],
) -> tuple[list[list[list[int]]], list[str], dict[str, list[dict[str, Any]]]]:
    """The batches plus a last one of the grammar requests (prompts: the first ones)."""
    if not grammars:
        return batches, names, overrides
    return [*batches, ids[: len(grammars)]], [*names, "grammar"], {**overrides, str(len(batches)): grammars}


def specs_for(model: str, pair: Path, args: argparse.Namespace, mi: int) -> list[harness.RunSpec]:
    _, dtype = harness.MODELS[model]
    refs = harness.cached_reference(args.cache, model, pair, list(harness.PROMPTS), args.new_tokens)
    ids = [r.prompt_ids for r in refs]
    kinds = kinds_for(pair, refs)
    batches, names, overrides = batches_for(ids, kinds)
    extra: dict[str, Any] = {}
    if model == "hybrid":
        extra = {**harness.hybrid_override(pair / "target"), "max_mamba_cache_size": 256}
    specs = []
    for si, mode in enumerate(MODES):
        engine_args = argparse.Namespace(
            cuda_graph=not mode.endswith("-eager"),
            mem_fraction=args.mem_fraction,
            tp=1,
            tree_budget=args.tree_budget,
            tree_topk=args.tree_topk,
            log_interval=4,
        )
        port = args.port_base + 200 * (mi * len(MODES) + si)
        base = harness.engine_kwargs(pair, dtype, engine_args, max(len(b) for b in batches), port)
        mode_engine, env = harness.mode_spec(mode.removesuffix("-eager"), pair, engine_args)
        if mode.startswith("tree"):
            env = {**env, "DDTREE_SELFCHECK_EVERY": "3"}
        run_batches, run_names, run_overrides = batches, names, overrides
        if mode.endswith("-eager"):
            grammars = [GRAMMARS[g] for g in args.grammar.split(",") if g]
            run_batches, run_names, run_overrides = with_grammar(batches, names, overrides, ids, grammars)
        specs.append(
            harness.RunSpec(
                model,
                mode,
                {**base, **extra, **mode_engine, **DETERMINISTIC},
                env,
                run_batches,
                run_names,
                args.new_tokens,
                overrides=run_overrides,
                top_logprobs=args.top_logprobs,
            )
        )
    return specs


@dataclass(frozen=True)
class Tolerance:
    """|tree - baseline| <= atol + rtol * |baseline| per log-prob. The tree verify and the baseline's decode step
    are different kernels, so their logits round differently: fp32 matmuls in Triton run as TF32 on Hopper (10
    mantissa bits), bf16 keeps 8."""

    atol: float
    rtol: float

    def within(self, got: float, want: float) -> bool:
        return abs(got - want) <= self.atol + self.rtol * abs(want)


TOLERANCES = {"float32": Tolerance(0.01, 0.01), "bfloat16": Tolerance(0.05, 0.03)}


def logprob_check(got: dict[str, Any], want: dict[str, Any], tol: Tolerance) -> tuple[bool, float]:
    """(every log-prob within `tol`, the largest |difference|) of two runs of one request: the chosen tokens'
    log-probs position by position, and the top-K lists by token id (a token in one list only must sit within
    `tol` of the other list's K-th value: a near-tie at the cut)."""
    ok, gap = True, 0.0
    g_tok, w_tok = got.get("output_token_logprobs"), want.get("output_token_logprobs")
    g_top, w_top = got.get("output_top_logprobs"), want.get("output_top_logprobs")
    if not g_tok or not w_tok or len(g_tok) != len(w_tok) or not g_top or not w_top or len(g_top) != len(w_top):
        return False, float("inf")
    for (va, ta, *_), (vb, tb, *_) in zip(g_tok, w_tok, strict=True):
        ok = ok and ta == tb and tol.within(float(va), float(vb))
        gap = max(gap, abs(float(va) - float(vb)))
    for a, b in zip(g_top, w_top, strict=True):
        ga, gb = {int(t): float(v) for v, t, *_ in a}, {int(t): float(v) for v, t, *_ in b}
        for token in ga.keys() | gb.keys():
            if token in ga and token in gb:
                ok = ok and tol.within(ga[token], gb[token])
                gap = max(gap, abs(ga[token] - gb[token]))
            else:
                mine, other = (ga, gb) if token in ga else (gb, ga)
                ok = ok and tol.within(mine[token], min(other.values()))
    return ok, gap


def compare(base: dict[str, Any], tree: dict[str, Any], tolerance: Tolerance) -> list[dict[str, Any]]:
    """One row per request of the tree run against the baseline run: equal?, first difference, log-prob gap."""
    rows = []
    for name, want_batch, got_batch in zip(
        base["batch_names"], base["result"]["batches"], tree["result"]["batches"], strict=True
    ):
        for i, (w, g) in enumerate(zip(want_batch, got_batch, strict=True)):
            row: dict[str, Any] = {
                "batch": name,
                "request": i,
                "kind": KINDS[i][0] if name == "kinds" else (KINDS[ALONE][0] if name == "alone" else name),
                "finish": w["meta_info"].get("finish_reason"),
                "equal": g["output_ids"] == w["output_ids"],
                "first_difference": harness.first_difference(g["output_ids"], w["output_ids"]),
                "accept_length": g["meta_info"].get("spec_accept_length"),
                "baseline": w["output_ids"],
                "tree": g["output_ids"],
            }
            if name == "kinds":
                row["logprobs_ok"], row["logprob_gap"] = logprob_check(g["meta_info"], w["meta_info"], tolerance)
            rows.append(row)
    return rows


def tree_rounds(run: dict[str, Any]) -> int:
    """The tree rounds the run's DDTREE metrics lines count (each line: the rounds since start)."""
    return max((int(float(m.get("rounds", 0))) for m in run["metrics"]), default=0)


def log_flags(run: dict[str, Any]) -> dict[str, bool]:
    """What a tree run's engine log says: a batch took DFLASH's chain round, a self-check failed. Read from the log
    file where it exists (the machine that ran it; then kept in the run as "log_flags"), else the stored flags."""
    path = Path(run.get("log") or "/nonexistent")
    if path.is_file():
        log = path.read_text()
        run["log_flags"] = {"dflash_rounds_logged": DFLASH_ROUND in log, "selfcheck_failed": SELFCHECK_FAILED in log}
    return dict(run["log_flags"])


def judge(models: list[str], runs_by_model: dict[str, dict[str, dict[str, Any]]], report: dict[str, Any]) -> int:
    """Every model's verdicts (tree against baseline, CUDA graphs on and off) printed and put into
    `report["models"]`; returns the number of failures (a failed run, or a pair with a difference)."""
    failures = 0
    for model in models:
        tolerance = TOLERANCES[harness.MODELS[model][1]]
        runs = runs_by_model[model]
        failures += sum(1 for r in runs.values() if not r["ok"])
        verdicts: dict[str, Any] = {}
        for graphs in ("", "-eager"):
            base, tree = runs[f"baseline{graphs}"], runs[f"tree{graphs}"]
            if not (base["ok"] and tree["ok"]):
                print(f"\n{model}, CUDA graphs {'off' if graphs else 'on'}: no verdict (a run failed)")
                continue
            rows = compare(base, tree, tolerance)
            flags = log_flags(tree)
            verdict = {
                "rows": rows,
                "equal": sum(r["equal"] for r in rows),
                "requests": len(rows),
                "logprobs_ok": all(r.get("logprobs_ok", True) for r in rows),
                "tree_rounds": tree_rounds(tree),
                **flags,
            }
            bad = (
                verdict["equal"] != verdict["requests"]
                or not verdict["logprobs_ok"]
                or verdict["tree_rounds"] == 0
                or verdict["dflash_rounds_logged"]
                or verdict["selfcheck_failed"]
            )
            failures += int(bad)
            verdicts[f"graphs {'off' if graphs else 'on'}"] = verdict
            print(
                f"\n{model}, CUDA graphs {'off' if graphs else 'on'}: tree == baseline on {verdict['equal']}/"
                f"{verdict['requests']} requests; log-probs within {tolerance}: {verdict['logprobs_ok']}; "
                f"tree rounds {verdict['tree_rounds']}; DFLASH rounds logged: {verdict['dflash_rounds_logged']}; "
                f"self-check failed: {verdict['selfcheck_failed']}"
            )
            for r in rows:
                lp = f" logprob gap {r['logprob_gap']:.2e}" if r.get("logprob_gap") is not None else ""
                print(
                    f"  {r['batch']:8} {r['request']} {'==' if r['equal'] else 'DIFF@' + str(r['first_difference'])}"
                    f" accept {r['accept_length']}{lp}  {r['kind']}"
                )
        report["models"][model] = {"verdicts": verdicts, "runs": runs}
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="dense,hybrid")
    p.add_argument("--cache", type=Path, default=harness.REPO / ".cache" / "sglang_gpu")
    p.add_argument("--json", type=Path, default=Path("kinds_gpu.json"))
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/kinds_gpu_logs"))
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--top-logprobs", type=int, default=3)
    p.add_argument("--tree-topk", type=int, default=8)
    p.add_argument("--tree-budget", type=int, default=0, help="DDTREE_BUDGET (0: drafter block - 1)")
    p.add_argument("--mem-fraction", type=float, default=0.08)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--port-base", type=int, default=33000)
    p.add_argument("--timeout", type=int, default=300, help="seconds per Engine launch")
    p.add_argument("--grammar", default="regex,json", help=f"grammar requests of the last batch: {', '.join(GRAMMARS)}")
    p.add_argument("--report", type=Path, help="judge the runs stored in this JSON again; launch nothing")
    p.add_argument("--dry-run", action="store_true", help="print the Engines and batches; launch nothing")
    args = p.parse_args(argv)
    models = args.models.split(",")
    if args.report is not None:
        stored = json.loads(args.report.read_text())
        again: dict[str, Any] = {"args": stored["args"], "kinds": KINDS, "models": {}}
        runs = {m: stored["models"][m]["runs"] for m in models if m in stored["models"]}
        failures = judge(list(runs), runs, again)
        print(f"\n{failures} failure(s) in {args.report}")
        return 1 if failures else 0
    pairs = {m: harness.ensure_pair(args.cache, m, 1) for m in models}
    specs = [s for mi, m in enumerate(models) for s in specs_for(m, pairs[m], args, mi)]
    if args.dry_run:
        for s in specs:
            print(s.model, s.mode, json.dumps(s.engine, sort_keys=True), s.env)
        print(json.dumps({"batches": specs[0].batch_names, "overrides": specs[0].overrides}, indent=1))
        return 0
    started = time.monotonic()
    results = harness.run_engines(specs, args.log_dir, args.timeout, args.parallel)

    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "kinds": KINDS, "models": {}}
    failures = judge(models, {m: {mode: results[(m, mode)] for mode in MODES} for m in models}, report)
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["failures"] = failures
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str))
    print(f"\n{failures} failure(s); JSON: {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
