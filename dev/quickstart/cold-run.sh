#!/usr/bin/env bash
# The README quick start (`bash scripts/setup && bash scripts/lab-journey`) with this machine's caches removed,
# timed line by line (docs/quickstart.md). As root. DESTRUCTIVE for local state: takes the lab down and deletes
# opsctl's caches (/var/cache/opsctl/{lab,tiny,wheelhouse,manifests}: the rootfs, the tiny models, the
# wheelhouse) and pip's cache; installs into a new virtualenv (the system Python is left alone) from a fresh
# clone of this checkout's HEAD. With COLD_APT=1 it also removes the lab's Debian packages first, so setup
# installs them again (from apt's local archive if it still holds them).
#
#   bash dev/quickstart/cold-run.sh [OUT_DIR]      -> OUT_DIR/quickstart.log (default /tmp/quickstart-cold)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/quickstart-cold}
work=$(mktemp -d /tmp/quickstart-XXXXXX)
mkdir -p "$out"
if command -v opsctl >/dev/null; then opsctl lab down >/dev/null 2>&1 || true; fi
rm -rf /var/cache/opsctl/lab /var/cache/opsctl/tiny /var/cache/opsctl/wheelhouse /var/cache/opsctl/manifests
python3 -m pip cache purge >/dev/null 2>&1 || true
if [ "${COLD_APT:-0}" = 1 ]; then
  apt-get remove -y -qq systemd-container mmdebstrap rsync >/dev/null
fi
git clone -q "$repo" "$work/opsctl"
python3 -m venv "$work/venv"
echo "cold run: clone $work/opsctl, venv $work/venv, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
set +e
(
  cd "$work/opsctl"
  export PATH="$work/venv/bin:$PATH" PIP_NO_CACHE_DIR=1
  bash scripts/setup && bash scripts/lab-journey
) 2>&1 | python3 "$repo/dev/quickstart/stamp.py" "$out/quickstart.log"
rc=${PIPESTATUS[0]}
set -e
echo "cold run: exit $rc, load after $(cut -d' ' -f1-3 /proc/loadavg); $out/quickstart.log" >&2
tail -25 "$out/quickstart.log" >&2
exit "$rc"
