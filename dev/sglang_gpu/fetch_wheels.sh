#!/usr/bin/env bash
# dev/sglang_gpu/fetch_wheels.sh [--server]: download, here (a machine with a package index), the cp312 wheels
# that SGLang 0.5.23's Engine needs on the H200 dev machine into .whl/ (git-ignored; ~47 MiB), and with --server
# into .whl-server/ the ~11 MiB more that its HTTP server (python -m sglang.launch_server) imports at module level.
# The list is ../shared/notes/sglang-on-h200.md's. Copy ".whl" (and ".whl-server" for the HTTP server) to the GPU machine with each job:
# the 64 MiB limit on what is copied there holds the tree, both wheel folders and little else.
set -euo pipefail
cd "$(dirname "$0")/../.."
engine=(sglang==0.5.23 apache-tvm-ffi==0.1.11 pydantic==2.13.4 pydantic_core==2.46.4 xgrammar==0.2.7 openai==2.8.0
  pyzmq==27.3.0 ipython==9.18.1 msgspec==0.23.0 compressed-tensors==0.18.0 fastapi==0.165.0 orjson==3.13.0
  dill==0.4.1 gguf==0.19.0 pybase64==1.5.1 uvicorn==0.54.0 traitlets==5.16.1 starlette==1.10.0 loguru==0.7.3
  opentelemetry-api==1.45.2 setproctitle==1.3.8 distro==1.9.0 typing-inspection==0.4.5 annotated-types==0.8.0
  partial-json-parser==0.2.1.1.post7 sniffio==1.3.1 annotated-doc==0.0.7)
# the H200 image already has attrs, sentencepiece, uvloop, aiohttp, multidict, yarl, frozenlist, aiosignal,
# aiohappyeyeballs and propcache (the GPU machine has them): copying them too put the tree over 64 MiB
server=(jsonschema referencing jsonschema-specifications rpds-py soundfile cffi pycparser python-multipart)
download() {  # DIR NAME...
  local dir=$1
  shift
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$dir" "$@"
  du -sh "$dir"
}
download .whl "${engine[@]}"
if [ "${1:-}" = --server ]; then download .whl-server "${server[@]}"; fi
# The 64 MiB copy limit: sglang's wheel less sglang/multimodal_gen (diffusion serving, ~4.5 MiB packed, imported by
# neither the Engine nor the LLM HTTP server), repacked in place with its RECORD lines removed.
python3 - .whl/sglang-0.5.23-*.whl <<'PY'
import sys, zipfile, os
path = sys.argv[1]
tmp = path + ".slim"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if item.filename.startswith("sglang/multimodal_gen/"):
            continue
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(x for x in lines if not x.startswith("sglang/multimodal_gen/")).encode()
        dst.writestr(item, data)
os.replace(tmp, path)
PY
du -sh .whl
