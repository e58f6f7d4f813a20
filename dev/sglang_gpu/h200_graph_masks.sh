#!/usr/bin/env bash
# dev/sglang_gpu/h200_graph_masks.sh: the H200 run behind docs/sglang.md "CUDA graphs": DDTREE tree verifies
# replayed from SGLang's target-verify CUDA graphs, before and after ddtree.sglang.graph_masks, in one run.
# Dense tiny pair (fp32), triton attention, CUDA graphs on, baseline + tree, 27 requests; each variant with the
# self-check on every round (DDTREE_SELFCHECK_EVERY=1: every accepted path re-verified as a chain) and off.
# "before" = DDTREE_DEV_CAUSAL_VERIFY_GRAPHS=1 (standin/sitecustomize.py: graphs captured without the mask, as
# SGLang 0.5.23 does for DFLASH on triton). Results under $OUT/<variant>-sc<N>/; a summary in $OUT/summary.log.
# Needs .whl and .cache/sglang_gpu (dev/sglang_gpu/prepare.sh) in the repository root.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/summary.log"
for run in ${RUNS:-after-sc1 before-sc1 after-sc0 before-sc0}; do
    variant=${run%-sc*} every=${run#*-sc}
    causal=0
    [ "$variant" = before ] && causal=1
    mkdir -p "$R/$run"
    start=$SECONDS
    DDTREE_DEV_CAUSAL_VERIFY_GRAPHS=$causal DDTREE_SELFCHECK_EVERY=$every OUT="$R/$run" timeout 170 \
        bash dev/sglang_gpu/run.sh --models dense --modes baseline,tree --cuda-graph --extra-prompts 20 \
        --timeout 150 > "$R/$run/run.log" 2>&1
    rc=$?
    {
        echo "== $run: rc=$rc in $((SECONDS - start))s"
        logs=("$R/$run"/sglang_gpu_logs/*/engine.log)
        echo "self-check rounds equal: $(cat "${logs[@]}" 2>/dev/null | grep -c 'equals the chain verify'), of them" \
            "with near-ties: $(cat "${logs[@]}" 2>/dev/null | grep -c 'near-ties'), decode lines with" \
            "cuda graph True: $(cat "${logs[@]}" 2>/dev/null | grep -c 'cuda graph: True')"
        cat "${logs[@]}" 2>/dev/null | grep -h "self-check FAILED\|graphs read the tree mask" | cut -c1-400 | head -3
        tail -15 "$R/$run/run.log"
    } >> "$R/summary.log"
done
exit 0
