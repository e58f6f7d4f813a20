#!/usr/bin/env bash
# dev/sglang_gpu/h200_pairs.sh stage | first | second | third: the pairs bench in back-to-back H200
# runs.
#
#   bash dev/sglang_gpu/h200_pairs.sh stage     # here (PyPI reachable): wheels, corpus wheels, and a copy of HEAD's
#                                               # opsctl + runtime + this directory into .cache/gpu-pairs (~49 MB)
#   # GPU machine, .cache/gpu-pairs copied there, at most 600 s, one job each, the second right after the first (a warm
#   # machine keeps /tmp: the pairs built by the first job (/tmp/pairs, by content hash), the installed wheels
#   # and Triton's cache; a cold one builds again and the deadline cuts what is left):
#   bash .cache/gpu-pairs/dev/sglang_gpu/h200_pairs.sh first    # builds, 8 services, greedy check, levels t0/t1
#   bash .cache/gpu-pairs/dev/sglang_gpu/h200_pairs.sh second   # + tree 7 (10 services), 64-prompt check, again
#   bash .cache/gpu-pairs/dev/sglang_gpu/h200_pairs.sh third    # greedy only, a third server start (timeout 400)
#   # here: each run's tables, then the runs' medians and ranges
#   python3 dev/sglang_gpu/pairs_report.py <returned OUT>/pairs_bench1.json
#   python3 dev/sglang_gpu/pairs_report.py pairs_bench1.json pairs_bench2.json pairs_bench3.json
#
# The copy is taken from HEAD (git archive), not the working tree, so edits in progress elsewhere in the checkout do
# not travel; only dev/sglang_gpu comes from the working tree. docs/runtime-perf.md "Small pairs on real text" has the results.
set -euo pipefail
case "${1:-}" in
stage)
    cd "$(dirname "$0")/../.."
    [ -d .whl ] && [ -d .whl-server ] || bash dev/sglang_gpu/fetch_wheels.sh --server
    PYTHONPATH=$PWD/runtime python3 -m ddtree.pairs fetch --wheels .cache/pairs/wheels
    D=.cache/gpu-pairs
    rm -rf "$D" && mkdir -p "$D/dev" "$D/.cache/pairs"
    git archive HEAD opsctl runtime pyproject.toml tests/runtime/sglang_cpu.py \
        tests/runtime/sglang_engine/engine_patches.py | tar -x -C "$D"
    rsync -a --exclude __pycache__ dev/sglang_gpu "$D/dev/"
    rsync -a .whl .whl-server "$D/"
    rsync -a .cache/pairs/wheels "$D/.cache/pairs/"
    du -sh "$D"
    ;;
first | second | third)
    cd "$(dirname "$0")/../.."
    : "${OUT:?the GPU job sets OUT}"
    set -o pipefail
    export PYTHONUNBUFFERED=1 SGLANG_GPU_SITE=/tmp/site-pairs
    case $1 in first) n=1 ;; second) n=2 ;; *) n=3 ;; esac
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
        nproc
        ls /tmp/pairs 2>&1 || true
    } >"$OUT/machine$n.txt" 2>&1
    if [ "$1" = first ]; then  # 8 services: base, linear, tree 15, policy 15 per pair
        args=(--budgets 15 --deadline 505 --check-prompts 32)
        limit=578
    elif [ "$1" = second ]; then  # 10 services: tree 7 as a second fixed shape for the policy's "best fixed tree"
        args=(--budgets 7,15 --deadline 490 --check-prompts 64)
        limit=575
    else  # this one can also run inline (the same flags): greedy levels of a third server start, warm machine
        args=(--budgets 7,15 --deadline 320 --check-prompts 32 --temperatures 0)
        limit=370
    fi
    timeout -k 5 "$limit" bash dev/sglang_gpu/run.sh pairs --json "$OUT/pairs_bench$n.json" --rg-budgets "" \
        --policy-budgets 15 --prompts 16 --start-timeout 240 "${args[@]}" 2>&1 | tee "$OUT/run$n.log"
    ;;
*)
    echo "usage: $0 stage | first | second | third" >&2
    exit 2
    ;;
esac
