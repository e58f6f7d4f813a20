#!/usr/bin/env bash
# dev/sglang_gpu/prepare.sh: run here (a CPU box with the runtime's dependencies) before a GPU job: builds the
# tiny dense and hybrid pairs (head_dim 32, ~2-3 min each, in parallel) and transformers' float32 references for
# the 6 + 20 harness prompts into .cache/sglang_gpu (git-ignored, ~6 MB), so the GPU machine spends no time on
# them. Copy ".cache/sglang_gpu" with ".whl" to the GPU machine (the 64 MiB copy limit: ~48 MB of wheels + ~6 MB + the tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
python3 dev/sglang_gpu/harness.py --models dense --prepare-only --extra-prompts 20 "$@" &
python3 dev/sglang_gpu/harness.py --models hybrid --prepare-only --extra-prompts 20 "$@" &
wait -n && wait -n
du -sh .cache/sglang_gpu
