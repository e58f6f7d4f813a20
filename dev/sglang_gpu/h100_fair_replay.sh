#!/usr/bin/env bash
# dev/sglang_gpu/h100_fair_replay.sh: the fair replay at Qwen3.6-27B's shape (docs/runtime-perf.md, "The fair replay:
# how to reproduce"). Both modes replay the hybrid pair's recorded acceptance on real text (the tree its paths,
# DFLASH its accepted lengths through the stand-in's R1 patch), every batch size the same recorded requests, at
# temperature 0, 0.7 and 1 (DFLASH samples through the stand-in's G6 sampling verify), tree budgets 15 and 7.
# Budgets 31 and 63 cannot run on a hybrid target yet: the tree worker refuses DDTREE_BUDGET > block - 1 there
# (SGLang keeps recurrent verify states for block_size steps), and 63 exceeds the 2 x block verify window anywhere.
#
#   bash dev/sglang_gpu/h100_fair_replay.sh stage          # here: wheels + HEAD's opsctl, runtime, dev into $D
#   bash $D/dev/sglang_gpu/h100_fair_replay.sh all         # GPU: every step below in sequence (~75 min)
#
# Where a GPU command may run 600 s at most, the GPU steps go one job each (.cache/gpu-fair copied to the GPU machine,
# the same warm machine: the recordings stay in /tmp between jobs; a cold machine builds the pair again):
#
#   bash .cache/gpu-fair/dev/sglang_gpu/h100_fair_replay.sh sampling      # ~4 min: DFLASH samples (G6)
#   bash .cache/gpu-fair/dev/sglang_gpu/h100_fair_replay.sh record 0      # ~7 min: the pair, 3 services
#   bash .cache/gpu-fair/dev/sglang_gpu/h100_fair_replay.sh record 0.7
#   bash .cache/gpu-fair/dev/sglang_gpu/h100_fair_replay.sh record 1
#   bash .cache/gpu-fair/dev/sglang_gpu/h100_fair_replay.sh replay 0 15   # ~8 min: 27B shape, DFLASH + tree15
#   bash .cache/gpu-fair/dev/sglang_gpu/h100_fair_replay.sh replay 0.7 15 # then 1 15, and 0 7, 0.7 7, 1 7
#   bash dev/sglang_gpu/h100_fair_replay.sh report <every job's returned $OUT>   # here: the tables
#
# Results under $OUT: machine-*.txt, sampling.{json,log}, record-t*.{tgz,log} with accepts-hybrid-t*.json and
# paths-hybrid-b*-t*.json beside them, fair-t*-b*.{json,log,md} (the cost JSON, its log, its table); `report`
# writes docs/results/gpu-fair-replay/ (the files and README.md with every table).
set -euo pipefail
D=.cache/gpu-fair
REC=/tmp/fair-rec  # recordings on the GPU machine (a warm machine keeps /tmp between jobs)
tag() { local t=${1/./}; echo "t$t"; }  # 0 -> t0, 0.7 -> t07, 1 -> t1 (pairs_interleaved's file names)
gpu_step() {
    cd "$(dirname "$0")/../.."
    : "${OUT:?the GPU job sets OUT}"
    export PYTHONUNBUFFERED=1 SGLANG_GPU_SITE=/tmp/site-fair
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/machine-$1.txt" 2>&1 || true
}
case "${1:-}" in
stage)
    cd "$(dirname "$0")/../.."
    [ -d .whl ] && [ -d .whl-server ] || bash dev/sglang_gpu/fetch_wheels.sh --server
    PYTHONPATH=$PWD/runtime python3 -m ddtree.pairs fetch --wheels .cache/pairs/wheels
    rm -rf "$D" && mkdir -p "$D/.cache/pairs"
    git archive HEAD opsctl runtime pyproject.toml tests/runtime/sglang_cpu.py \
        tests/runtime/sglang_engine/engine_patches.py dev/sglang_gpu | tar -x -C "$D"
    rsync -a .whl .whl-server "$D/"
    rsync -a .cache/pairs/wheels "$D/.cache/pairs/"
    du -sh "$D"
    ;;
sampling)  # linear at T > 0 samples: greedy repeats itself, sampled runs do not; accept length per temperature
    gpu_step sampling
    timeout -k 5 560 bash dev/sglang_gpu/run.sh sampling --model hybrid --temperatures 0,0.7,1 \
        --json "$OUT/sampling.json" 2>&1 | tee "$OUT/sampling.log"
    ;;
record)  # the pair on real text at one temperature: DFLASH's lengths, the tree's paths at budgets 15 and 7
    t=${2:?temperature: 0, 0.7 or 1}
    gpu_step "record-$(tag "$t")"
    dir=$REC/$(tag "$t") && rm -rf "$dir" && mkdir -p "$dir"
    # FAIR_BUDGETS / FAIR_DEADLINE: a shorter job where device time is short (FAIR_BUDGETS=15 FAIR_DEADLINE=380)
    timeout -k 5 $((${FAIR_DEADLINE:-520} + 50)) bash dev/sglang_gpu/run.sh interleaved --pairs hybrid \
        --record "$dir" --record-fair --budgets "${FAIR_BUDGETS:-15,7}" --temperatures "$t" --concurrency 1 \
        --prompts 16 --deadline "${FAIR_DEADLINE:-520}" \
        --start-timeout 240 --json "$dir/run.json" 2>&1 | tee "$OUT/record-$(tag "$t").log" || true
    tar -czf "$OUT/record-$(tag "$t").tgz" -C "$REC" "$(tag "$t")"
    cp "$dir"/accepts-*.json "$dir"/paths-*.json "$OUT/" 2>/dev/null || true
    ;;
replay)  # 27B shape, random weights, CUDA graphs: DFLASH and tree<budget> replaying the recordings of one temperature
    t=${2:?temperature: 0, 0.7 or 1} budget=${3:?tree budget: 15 or 7}
    gpu_step "replay-$(tag "$t")-b$budget"
    rec=$REC/$(tag "$t")
    # a fresh machine has no /tmp recordings: the files a record job returned, carried in under $D/rec/<tag>/
    [ -d "$rec" ] || rec=$PWD/rec/$(tag "$t")
    accepts=$rec/accepts-hybrid-$(tag "$t").json
    paths=$rec/paths-hybrid-b$budget-$(tag "$t").json
    [ -f "$accepts" ] && [ -f "$paths" ] || { echo "no recording at $(tag "$t"): run 'record $t' first" >&2; exit 2; }
    batches=1,2,4,8  # 80 GB: batch 8 at most at this shape (GDN state per draft token); 139 GB: up to 48
    gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    [ "${gpu_mib:-0}" -gt 100000 ] && batches=1,2,4,8,16,32,48
    name=fair-$(tag "$t")-b$budget
    timeout -k 5 585 bash dev/sglang_gpu/run.sh cost --models hybrid --modes "dflash,tree$budget" --graphs on \
        --batches "$batches" --mem-fraction-hybrid 0.92 --new-tokens 128 --timeout 240 --fair \
        --replay "$paths" --replay-dflash "$accepts" --temperature "$t" --json "$OUT/$name.json" \
        2>&1 | tee "$OUT/$name.log" || true
    PYTHONPATH=$PWD:$PWD/runtime python3 dev/sglang_gpu/cost_bench.py --fair-report "$OUT/$name.json" \
        --replay "$paths" --replay-dflash "$accepts" | tee "$OUT/$name.md"
    ;;
all)  # every GPU step, for a machine without a per-command limit
    "$0" sampling
    for t in 0 0.7 1; do "$0" record "$t"; done
    for b in 15 7; do for t in 0 0.7 1; do "$0" replay "$t" "$b"; done; done
    ;;
report)  # here: the jobs' files into docs/results/gpu-fair-replay/, every table into its README.md
    cd "$(dirname "$0")/../.."
    R=${2:?a directory with the files of the jobs}
    dest=docs/results/gpu-fair-replay && mkdir -p "$dest"
    find "$R" \( -name 'fair-*' -o -name 'machine-*' -o -name 'sampling.*' -o -name 'accepts-*' -o -name 'paths-*' \
        -o -name 'record-*.log' \) -exec cp {} "$dest/" \;
    {
        echo "# The fair replay at the 27B shape: tables (dev/sglang_gpu/h100_fair_replay.sh report)"
        cat "$dest"/machine-*.txt 2>/dev/null | sort -u
        [ -f "$dest/sampling.log" ] && { echo; echo '## DFLASH samples'; echo; grep -E '^T=|sampling check' "$dest/sampling.log"; }
        for md in "$dest"/fair-*.md; do [ -f "$md" ] && { echo; echo "## ${md##*/}"; echo; cat "$md"; }; done
    } >"$dest/README.md"
    cat "$dest/README.md"
    ;;
*)
    echo "usage: $0 stage | sampling | record T | replay T BUDGET | all | report DIR" >&2
    exit 2
    ;;
esac
