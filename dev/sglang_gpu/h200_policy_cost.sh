#!/usr/bin/env bash
# dev/sglang_gpu/h200_policy_cost.sh: the H200 run behind docs/runtime-perf.md "The shape policy":
# dflash, tree, tree-chain (the policy pinned to the chain) and tree-policy on the random-weight real shapes,
# CUDA graphs on, `REPEATS` measured batches per batch size (medians), then the policy table and the DDTREE
# lines that show what the workers did. Copy .whl to the GPU machine. Results under $OUT: cost.json, policy-report.md,
# ddtree-lines.txt, each engine log's tail, round-graphs.log (the CUDA test of RoundGraphs.warm, if pytest is there).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
MODELS=${MODELS:-dense} MODES=${MODES:-dflash,tree,tree-chain,tree-policy} BATCHES=${BATCHES:-1,4,8,16,32}
NEW=${NEW:-96} REPEATS=${REPEATS:-3} LIMIT=${LIMIT:-520}
start=$SECONDS
timeout "$LIMIT" bash dev/sglang_gpu/run.sh cost --models "$MODELS" --modes "$MODES" --graphs on \
    --batches "$BATCHES" --new-tokens "$NEW" --repeats "$REPEATS" --timeout "${ENGINE_TIMEOUT:-150}" \
    > "$R/cost-run.log" 2>&1
echo "cost run: rc=$? in $((SECONDS - start)) s" | tee -a "$R/cost-run.log"
python3 dev/sglang_gpu/cost_bench.py --policy-report "$R/cost.json" | tee "$R/policy-report.md"
grep -h "DDTREE policy\|DDTREE:\|DDTREE metrics\|Capture cuda graph\|Capture target verify" \
    /tmp/cost_logs/*/engine.log | cut -c1-600 > "$R/ddtree-lines.txt"
for d in /tmp/cost_logs/*/; do tail -c 20000 "$d/engine.log" > "$R/$(basename "$d").log.tail"; done
if python3 -c "import pytest" 2>/dev/null; then
    PYTHONPATH=$PWD:$PWD/runtime timeout 60 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_round_graphs.py \
        > "$R/round-graphs.log" 2>&1
fi
exit 0
