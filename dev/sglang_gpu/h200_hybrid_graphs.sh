#!/usr/bin/env bash
# dev/sglang_gpu/h200_hybrid_graphs.sh correct|cost: the H200 runs behind docs/sglang.md "Hybrid targets under
# CUDA graphs": the hybrid tree verify replayed from graphs captured on SGLang's GDN tree path.
#   correct: the tiny hybrid pair (bf16, head_dim 32), 6 + 40 prompts, baseline / DFLASH / DDTREE tree at two
#            (budget, top-k) settings, CUDA graphs on and off side by side; a run with the self-check every round;
#            the mixed greedy + sampled batch, graphs on and off. Engines of a wave run at once (ports apart).
#   cost:    cost_bench.py at the Qwen3.6-27B shape (random weights), DFLASH and DDTREE with graphs, bs 1/8/32.
# Needs .whl and .cache/sglang_gpu (harness.py --models hybrid --prepare-only --extra-prompts 40) in the
# repository root. Everything lands in /tmp/h27 and comes back as $OUT/summary.log + $OUT/results.tgz (the run
# tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp}
W=/tmp/h27
rm -rf "$W" && mkdir -p "$W"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/summary.log"
# install once through run.sh (its --prepare-only run checks the cache), then run harnesses side by side with
# run.sh's environment (concurrent run.sh runs would race on the runtime's install)
if [ "${1:-correct}" = correct ]; then
    bash dev/sglang_gpu/run.sh --models hybrid --prepare-only --extra-prompts 40 > "$W/install.log" 2>&1
else
    bash dev/sglang_gpu/run.sh cost --configs-only --cache /tmp/cb > "$W/install.log" 2>&1
fi
echo "install rc=$?" >> "$R/summary.log"
export PYTHONPATH="$PWD/dev/sglang_gpu/standin:/tmp/site" SGLANG_FORCE_FUSED_OP_BACKEND=torch
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1

harness() {  # harness <name> <port> <env...> -- <harness flags...>
    local name=$1 port=$2
    shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    mkdir -p "$W/$name"
    local start=$SECONDS
    env "${envs[@]}" timeout 230 python3 dev/sglang_gpu/harness.py --models hybrid --extra-prompts 40 \
        --port-base "$port" --parallel 3 --timeout 200 --json "$W/$name/sglang_gpu.json" --log-dir "$W/$name/logs" \
        "$@" > "$W/$name/run.log" 2>&1
    echo "== $name: rc=$? in $((SECONDS - start))s" >> "$W/done.log"
}

mixed() {  # mixed <name> <port> <graphs 0|1>
    local start=$SECONDS
    MIXED_MODEL=hybrid MIXED_EXTRA_PROMPTS=40 MIXED_GRAPHS=$3 MIXED_PORT=$2 MIXED_NAME=$1 OUT=$W \
        timeout 230 python3 dev/sglang_gpu/mixed_batch.py > "$W/$1.log" 2>&1
    echo "== $1: rc=$? in $((SECONDS - start))s" >> "$W/done.log"
}

if [ "${1:-correct}" = correct ]; then
    A=(--tree-budget 7 --tree-topk 4)
    B=(--tree-budget 5 --tree-topk 8)
    harness graph-b7k4 31000 DDTREE_SELFCHECK_EVERY=0 -- --cuda-graph "${A[@]}" --modes baseline,dflash,tree &
    harness eager-b7k4 34000 DDTREE_SELFCHECK_EVERY=0 -- "${A[@]}" --modes baseline,dflash,tree &
    mixed mixed-graph 37000 1 &
    mixed mixed-eager 38000 0 &
    wait
    harness graph-b5k8 31000 DDTREE_SELFCHECK_EVERY=0 -- --cuda-graph "${B[@]}" --modes baseline,dflash,tree &
    harness eager-b5k8 34000 DDTREE_SELFCHECK_EVERY=0 -- "${B[@]}" --modes baseline,dflash,tree &
    harness graph-b7k4-sc1 37000 DDTREE_SELFCHECK_EVERY=1 -- --cuda-graph "${A[@]}" --modes baseline,tree &
    wait
    cat "$W/done.log" >> "$R/summary.log"
    for run in graph-b7k4 eager-b7k4 graph-b5k8 eager-b5k8 graph-b7k4-sc1; do
        logs=("$W/$run"/logs/*/engine.log)
        {
            echo "== $run"
            echo "self-check rounds equal: $(cat "${logs[@]}" 2>/dev/null | grep -c 'equals the chain verify'), with" \
                "near-ties: $(cat "${logs[@]}" 2>/dev/null | grep -c 'near-ties'), FAILED:" \
                "$(cat "${logs[@]}" 2>/dev/null | grep -c 'self-check FAILED'), decode lines with cuda graph True:" \
                "$(cat "${logs[@]}" 2>/dev/null | grep -c 'cuda graph: True')"
            cat "${logs[@]}" 2>/dev/null | grep -h "GDN tree kernels\|self-check FAILED\|Traceback\|Error" | cut -c1-300 | head -4
            grep -v "^tree  \|^dflash  \|^baseline  " "$W/$run/run.log" | tail -12
        } >> "$R/summary.log"
    done
    for m in mixed-graph mixed-eager; do echo "== $m" >> "$R/summary.log"; tail -18 "$W/$m.log" >> "$R/summary.log"; done
else
    start=$SECONDS
    LOG_DIR=$W/cost_logs timeout 520 python3 dev/sglang_gpu/cost_bench.py --cache /tmp/cb --json "$W/cost-hybrid.json" \
        --log-dir "$W/cost_logs" --models hybrid --modes dflash,tree --graphs on --timeout 240 > "$W/cost.log" 2>&1
    echo "== cost: rc=$? in $((SECONDS - start))s" >> "$R/summary.log"
    tail -30 "$W/cost.log" >> "$R/summary.log"
    python3 dev/sglang_gpu/cost_bench.py --report "$W/cost-hybrid.json" >> "$R/summary.log" 2>&1
fi
find "$W" -name "*.prof" -delete
tar czf "$R/results.tgz" -C "$W" --exclude "install.log" --exclude "engine.log" . 2>/dev/null
tar czf "$R/engine-logs.tgz" -C "$W" $(cd "$W" && find . -name engine.log) 2>/dev/null  # may pass 16 MiB: then lost
exit 0
