#!/usr/bin/env bash
# dev/sglang_gpu/h200_fused_cost.sh: the H200 run behind docs/runtime-perf.md ("fused") and docs/sglang.md
# ("Cost at real shapes"), in priority order, each step time-boxed; results under $OUT:
# 1. fused planner: runtime/bench/round_bench.py (per-request path, torch batched path, fused Triton path, top-k floor;
#    parity on CUDA) -> round.json / round.log
# 2. the fused kernels and round graphs on CUDA: tests/runtime/test_fused_tree.py, test_round_graphs.py -> pytest.log
# 3. cost at real shapes: cost_bench.py, dense 8B shape, DFLASH and DDTREE with CUDA graphs -> cost-dense.json
# 4. cost at real shapes: cost_bench.py, hybrid 27B shape, DFLASH (graphs) and DDTREE (eager) -> cost-hybrid.json
#    (about 8.5 minutes in all on the H200)
# Needs .whl (SGLang's wheels, /work/shared/notes/sglang-on-h200.md) in the repository root.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/run.log"
PYTHONPATH=runtime timeout 150 python3 runtime/bench/round_bench.py --json "$R/round.json" > "$R/round.log" 2>&1
echo "round_bench rc=$?" >> "$R/run.log"
PYTHONPATH=runtime timeout 150 python3 -m pytest -q -p no:cacheprovider -m runtime -k "not interpreted" \
    tests/runtime/test_fused_tree.py tests/runtime/test_round_graphs.py > "$R/pytest.log" 2>&1
echo "pytest rc=$?" >> "$R/run.log"
cost() {  # cost <seconds> <json name> <log dir> [cost_bench flags...]
    local secs=$1 name=$2 logs=$3
    shift 3
    LOG_DIR=$logs timeout "$secs" bash dev/sglang_gpu/run.sh cost --cache /tmp/cb --json "$R/$name" "$@" \
        >> "$R/run.log" 2>&1
    echo "$name rc=$?" >> "$R/run.log"
}
cost 200 cost-dense.json /tmp/logs-dense --models dense --graphs on --timeout 150
cost 300 cost-hybrid.json /tmp/logs-hybrid --models hybrid --only hybrid-dflash-graph,hybrid-tree-eager --timeout 200
tar czf "$R/logs.tgz" -C /tmp logs-dense logs-hybrid 2>/dev/null
exit 0
