#!/usr/bin/env bash
# dev/sglang_gpu/run.sh [harness.py flags...]: SGLang 0.5.23's real Engine on the H200 dev machine (torch 2.11,
# no sglang, no package index), baseline / DFLASH / DDTREE shadow / DDTREE tree on the tiny pairs; see harness.py.
#
# From the repository root, with the SGLang wheels in .whl/ (docs/sglang-gpu.md) and,
# ideally, the tiny pairs pre-built into .cache/sglang_gpu (dev/sglang_gpu/prepare.sh); copy both to the GPU machine:
#     bash dev/sglang_gpu/run.sh --models dense,hybrid --modes baseline,dflash,shadow,tree
#     bash dev/sglang_gpu/run.sh cost --models dense,hybrid     # DFLASH vs DDTREE round cost (cost_bench.py)
# Steps:
# 1. pip-installs .whl/*.whl into $SGLANG_GPU_SITE (default /tmp/site; skipped when already there);
# 2. installs the ddtree runtime there with its entry-point metadata (a real wheel via `pip wheel` when
#    setuptools is importable, else install_runtime.py writes the same files);
# 3. PYTHONPATH = dev/sglang_gpu/standin (sitecustomize: the import-time patches, and the torch `sgl_kernel`
#    stand-in), then the site dir; SGLANG_FORCE_FUSED_OP_BACKEND=torch, SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1;
#    SGLANG_GPU_STANDIN=0 leaves the stand-in and patches out (a host with SGLang's real kernels);
# 4. runs harness.py, JSON and logs under $OUT (or /tmp) unless --json / --log-dir say otherwise.
# Exit status: harness.py's (1 when a DDTREE tree run differs from SGLang's baseline or a run failed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
SITE=${SGLANG_GPU_SITE:-/tmp/site}
RESULTS=${OUT:-/tmp}

# .whl-server/ (fetch_wheels.sh --server) holds what SGLang's HTTP server adds; the marker names the wheel set, so a
# warm machine (which keeps /tmp) installs a newly carried set instead of trusting an older marker
wheels=(.whl/*.whl)
if compgen -G ".whl-server/*.whl" >/dev/null; then wheels+=(.whl-server/*.whl); fi
wheel_set=$(printf '%s\n' "${wheels[@]##*/}" | sha256sum | cut -c1-16)
if [ ! -f "$SITE/.sglang_gpu_wheels.$wheel_set" ]; then
    echo "installing ${#wheels[@]} wheels into $SITE" >&2
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
    touch "$SITE/.sglang_gpu_wheels.$wheel_set"
fi

wheel_dir=$(mktemp -d)
if "$PY" -c "import setuptools" 2>/dev/null \
    && "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$wheel_dir" ./runtime >&2; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$wheel_dir"/ddtree_runtime-*.whl
    echo "ddtree-runtime: wheel built and installed into $SITE" >&2
else
    "$PY" dev/sglang_gpu/install_runtime.py runtime "$SITE" >&2
    echo "ddtree-runtime: no setuptools here; installed with install_runtime.py into $SITE" >&2
fi
rm -rf "$wheel_dir"

if [ "${SGLANG_GPU_STANDIN:-1}" = 1 ]; then
    export PYTHONPATH="$PWD/dev/sglang_gpu/standin:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export SGLANG_FORCE_FUSED_OP_BACKEND=torch SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1

"$PY" - <<'PY' >&2
import importlib.metadata as md, sys
import torch, triton, transformers, sgl_kernel, sglang
plugins = [e.value for e in md.entry_points(group="sglang.srt.plugins")]
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, "
      f"transformers {transformers.__version__}, sglang {sglang.__version__}, sgl_kernel {sgl_kernel.__file__}, "
      f"plugins {plugins}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NO CUDA'}")
PY

if [ "${1:-}" = cost ]; then  # cost at real shapes: cost_bench.py (random-weight 8B / 27B shapes)
    shift
    exec "$PY" dev/sglang_gpu/cost_bench.py --json "$RESULTS/cost.json" --log-dir "${LOG_DIR:-/tmp/cost_logs}" "$@"
fi
if [ "${1:-}" = pairs ]; then  # the small pairs on real text, every mode against concurrency (pairs_bench.py)
    shift
    exec "$PY" dev/sglang_gpu/pairs_bench.py "$@"
fi
if [ "${1:-}" = interleaved ]; then  # the pairs to +-5%, fresh server starts per round (pairs_interleaved.py)
    shift
    exec "$PY" dev/sglang_gpu/pairs_interleaved.py "$@"
fi
if [ "${1:-}" = kinds ]; then  # every request kind, tree vs baseline, CUDA graphs on and off
    shift
    exec "$PY" dev/sglang_gpu/kinds_gpu.py --json "$RESULTS/kinds_gpu.json" --log-dir "$RESULTS/kinds_gpu_logs" "$@"
fi
if [ "${1:-}" = sampling ]; then  # does DFLASH sample (the stand-in's G6 sampling verify)? dflash_sampling_check.py
    shift
    exec "$PY" dev/sglang_gpu/dflash_sampling_check.py "$@"
fi
if [ "${1:-}" = mixed ]; then  # greedy requests batched with a sampling one on a tree server with graphs
    shift
    exec "$PY" dev/sglang_gpu/mixed_batch.py "$@"
fi
exec "$PY" dev/sglang_gpu/harness.py --json "$RESULTS/sglang_gpu.json" --log-dir "$RESULTS/sglang_gpu_logs" "$@"
