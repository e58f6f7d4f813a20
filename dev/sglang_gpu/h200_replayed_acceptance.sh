#!/usr/bin/env bash
# dev/sglang_gpu/h200_replayed_acceptance.sh: the H200 jobs behind the replayed-acceptance tables (docs/runtime-perf.md, "How
# to reproduce / pending GPU run"). Each GPU step is one job of at most 600 s on the GPU machine, with .cache/gpu-replayed
# copied there and the job's $OUT copied back; a warm
# machine keeps /tmp (the pairs built by content hash, the installed wheels, Triton's cache), a cold one builds
# the pairs again (~190 s) inside the step's deadline.
#
#   bash dev/sglang_gpu/h200_replayed_acceptance.sh stage             # here: wheels, corpus wheels, HEAD's opsctl + runtime
#   bash .cache/gpu-replayed/dev/sglang_gpu/h200_replayed_acceptance.sh record hybrid   # GPU: recorded rounds + paths of a pair
#   bash .cache/gpu-replayed/dev/sglang_gpu/h200_replayed_acceptance.sh record dense
#   bash dev/sglang_gpu/h200_replayed_acceptance.sh carry <dir>  # here: the record jobs' returned $OUT paths into the copy
#   bash .cache/gpu-replayed/dev/sglang_gpu/h200_replayed_acceptance.sh shape hybrid a  # GPU: 27B shape, baseline, DFLASH, tree15
#   bash .cache/gpu-replayed/dev/sglang_gpu/h200_replayed_acceptance.sh shape hybrid b  # GPU: 27B shape, tree7, tree31
#   bash .cache/gpu-replayed/dev/sglang_gpu/h200_replayed_acceptance.sh shape dense ab  # GPU: 8B shape, all five
#   bash .cache/gpu-replayed/dev/sglang_gpu/h200_replayed_acceptance.sh pairs hybrid 0  # GPU: one round of the pairs (0, 1, 2)
#   ...                                                                # (pairs hybrid 1, 2; pairs dense 0, 1, 2)
#   bash dev/sglang_gpu/h200_replayed_acceptance.sh report <dir>      # here: every table from the jobs' returned files
#
# Results under $OUT: record-<pair>.tgz (rounds-<pair>.json, paths-<pair>.json, the JSON of the run) and
# paths-<pair>.json beside it, cost-*.json, pairs-<pair>-<round>.json, each step's log. The record step's paths
# file (DDTREE_RECORD_PATHS, ddtree-paths/2) holds each round's accepted path and the drafter's top-k log-probs;
# the shape step's replay (DDTREE_REPLAY_ACCEPTANCE) builds every round's tree from those and walks the path in
# it. A ddtree-paths/1 file (paths only) replays paths in the random drafter's trees: shallower, so record again.
set -euo pipefail
D=.cache/gpu-replayed
case "${1:-}" in
stage)
    cd "$(dirname "$0")/../.."
    [ -d .whl ] && [ -d .whl-server ] || bash dev/sglang_gpu/fetch_wheels.sh --server
    PYTHONPATH=$PWD/runtime python3 -m ddtree.pairs fetch --wheels .cache/pairs/wheels
    rm -rf "$D" && mkdir -p "$D/dev" "$D/.cache/pairs" "$D/paths"
    git archive HEAD opsctl runtime pyproject.toml tests/runtime/sglang_cpu.py \
        tests/runtime/sglang_engine/engine_patches.py | tar -x -C "$D"
    git archive HEAD dev/sglang_gpu | tar -x -C "$D"
    rsync -a .whl .whl-server "$D/"
    rsync -a .cache/pairs/wheels "$D/.cache/pairs/"
    du -sh "$D"
    ;;
carry)  # the recorded paths files of the record steps, into the staged copy (the shape steps read them there)
    cd "$(dirname "$0")/../.."
    find "${2:?the directory holding the returned files of the record jobs}" -name 'paths-*.json' -exec cp {} "$D/paths/" \;
    ls -la "$D/paths"
    ;;
record | shape | pairs)
    cd "$(dirname "$0")/../.."
    : "${OUT:?the GPU job sets OUT}"
    export PYTHONUNBUFFERED=1 SGLANG_GPU_SITE=/tmp/site-45
    pair=${2:?pair: dense or hybrid}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/machine-$1-$pair.txt" 2>&1 || true
    case $1 in
    record)  # ~8 min: 5 server starts alone (paths; tree15, tree7, tree3, chain pinned), greedy levels 1-32
        # recorded under /tmp (a warm machine keeps it; $OUT takes 8 files at most), then one archive into $OUT
        rec=/tmp/gpu45-rec/$pair && rm -rf "$rec" && mkdir -p "$rec"
        timeout -k 5 560 bash dev/sglang_gpu/run.sh interleaved --pairs "$pair" --record "$rec" \
            --budgets 15 --temperatures 0 --prompts 16 --deadline 500 --start-timeout 240 \
            --json "$rec/run.json" 2>&1 | tee "$OUT/record-$pair.log" || true
        tar -czf "$OUT/record-$pair.tgz" -C /tmp/gpu45-rec "$pair"
        cp "$rec/paths-$pair.json" "$OUT/" || true
        # the next job's shape step on this warm machine reads the paths here, with no carry step
        mkdir -p /tmp/gpu45-paths && cp "$rec/paths-$pair.json" /tmp/gpu45-paths/ || true
        ;;
    shape)  # ~7 min a part: Engines at the real shape (random weights), CUDA graphs, batch 1-64, 128 new tokens
        part=${3:?part: a, b or ab}
        case $part in a) modes=dflash,tree15,baseline ;; b) modes=tree7,tree31 ;; *) modes=dflash,tree7,tree15,tree31,baseline ;; esac
        # batch 48 at most on the 27B shape: SGLang keeps a GDN scratch state per draft token of every running
        # request (16 x ~76 MB each); at 64 it does not fit beside the weights on one H200 (DFLASH and DDTREE
        # alike), on an H100 (80 GB) above 8
        batches=1,2,4,8,16,32,64
        gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
        if [ "$pair" = hybrid ]; then
            batches=1,2,4,8,16,32,48 && [ "${gpu_mib:-0}" -lt 100000 ] && batches=1,2,4,8
        fi
        paths="paths/paths-$pair.json"  # this step runs in the staged copy, whose root holds the carried paths
        [ -f "$paths" ] || paths=/tmp/gpu45-paths/paths-$pair.json  # recorded on this warm machine
        [ -f "$paths" ] || paths=""  # before any recording: random-weight acceptance (a rehearsal of the cost)
        timeout -k 5 585 bash dev/sglang_gpu/run.sh cost --models "$pair" --modes "$modes" --graphs on \
            --batches "$batches" --mem-fraction-hybrid 0.92 --new-tokens 128 --repeats 1 --timeout 200 \
            ${paths:+--replay "$paths"} --json "$OUT/cost-$pair-$part.json" 2>&1 | tee "$OUT/cost-$pair-$part.log"
        ;;
    pairs)  # ~9 min a round: linear, tree7, tree15, policy15 each started alone, t0 and t1 levels 1-32
        round=${3:?round: 0, 1 or 2}
        timeout -k 5 585 bash dev/sglang_gpu/run.sh interleaved --pairs "$pair" --rounds 3 --only-round "$round" \
            --budgets 7,15 --policy-budgets 15 --prompts 16 --deadline 540 --start-timeout 240 \
            --json "$OUT/pairs-$pair-$round.json" 2>&1 | tee "$OUT/pairs-$pair-$round.log"
        ;;
    esac
    ;;
report)  # here, over a directory holding every job's returned files
    cd "$(dirname "$0")/../.."
    R=${2:?a directory with the files of the jobs}
    export PYTHONPATH=$PWD:$PWD/runtime
    for pair in hybrid dense; do
        mapfile -t pairs < <(find "$R" -name "pairs-$pair-*.json")
        default_tau=$([ "$pair" = hybrid ] && echo 2.11 || echo 3.56)  # the earlier pairs runs' DFLASH tau
        tau=$(python3 dev/sglang_gpu/pairs_interleaved.py --reference-tau "${pairs[@]}" --default-tau "$default_tau")
        mapfile -t costs < <(find "$R" -name "cost-$pair-*.json")
        if [ "${#costs[@]}" -gt 0 ]; then
            echo "## $pair shape, replayed acceptance (DFLASH at tau $tau)"
            python3 dev/sglang_gpu/cost_bench.py --replay-report "${costs[@]}" --dflash-tau "$tau"
        fi
        if [ "${#pairs[@]}" -gt 0 ]; then
            echo "## $pair pairs, interleaved starts"
            python3 dev/sglang_gpu/pairs_interleaved.py --report "${pairs[@]}"
        fi
        rounds=$(find "$R" -name "rounds-$pair.json" | head -1)
        if [ -n "$rounds" ]; then
            echo "## $pair policy simulator on the recorded rounds"
            python3 -m ddtree.policy_sim run "$rounds"
        fi
    done
    ;;
*)
    echo "usage: $0 stage | carry DIR | record PAIR | shape PAIR a|b|ab | pairs PAIR ROUND | report DIR" >&2
    exit 2
    ;;
esac
