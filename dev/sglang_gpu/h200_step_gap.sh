#!/usr/bin/env bash
# dev/sglang_gpu/h200_step_gap.sh [diag|final]: the H200 runs behind docs/sglang.md "Cost at real shapes", the step
# gap (host time between DDTREE's rounds) and the eager draft sampler; results under $OUT.
# - diag: dense 8B shape, CUDA graphs, DFLASH / DDTREE tree / DDTREE tree with SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1,
#   batch 1 / 8 / 32, with the scheduler-loop timer and a cProfile of the scheduler outside the rounds
#   (standin/loop_timer.py; the profile slows the host between rounds, so steps here are not the table's)
# - final: the same without the profile, and a second DFLASH Engine last (dflash-rep: how far one configuration
#   moves between Engines); MODES=...,tree-old runs DDTREE with the runtime in ./old_runtime (copied there by the
#   caller) in the same run, for a before/after of a worker change.
# Needs .whl (SGLang's wheels, /work/shared/notes/sglang-on-h200.md) in the repository root.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/run.log"
what=${1:-final}
if [ "$what" = diag ]; then
    LOG_DIR=/tmp/logs-diag timeout 480 bash dev/sglang_gpu/run.sh cost --cache /tmp/cb --json "$R/cost-dense-diag.json" \
        --models dense --graphs on --modes "${MODES:-dflash,tree,tree-es}" --loop-profile --timeout 150 >> "$R/run.log" 2>&1
    echo "diag rc=$?" >> "$R/run.log"
    logs=/tmp/logs-diag
else
    LOG_DIR=/tmp/logs-final timeout 560 bash dev/sglang_gpu/run.sh cost --cache /tmp/cb --json "$R/cost-dense-final.json" \
        --models dense --graphs on --modes "${MODES:-dflash,tree,tree-es,dflash-rep}" --old-runtime old_runtime \
        --timeout 150 >> "$R/run.log" 2>&1
    echo "final rc=$?" >> "$R/run.log"
    logs=/tmp/logs-final
fi
tar czf "$R/logs.tgz" -C "$(dirname $logs)" "$(basename $logs)" 2>/dev/null
exit 0
