#!/usr/bin/env bash
# The README quick start (`bash scripts/setup && bash scripts/lab-journey`) as a fresh machine runs it, timed line
# by line (docs/lab.md, "The quick start, timed"). As root.
#
# Nothing of this machine's state is touched: the run happens in a private mount namespace where empty
# directories stand in for opsctl's caches (/var/cache/opsctl: the lab rootfs, the tiny models, the wheelhouse,
# the model manifests) and its lab state (/var/lib/opsctl: the lab key, the hosts' disks), with a fresh
# XDG_STATE_HOME, a new virtualenv (the system Python is left alone), no pip cache, and a fresh clone of this
# checkout's HEAD. It runs on lab slot OPSCTL_LAB_SLOT (default 9), so a lab running here is left alone, and it
# takes its lab down at the end (the lab's network namespaces live in the private mount namespace).
# What a really fresh machine has and this run does not: the lab's Debian packages are already installed here
# (setup checks them in about a second instead of installing them, ~11 s), and pip's configuration may name a
# local package mirror (then torch and the wheelhouse come from local disk).
#
#   [COLD_RUN_REF=COMMIT] bash dev/quickstart/cold-run.sh [OUT_DIR]   -> OUT_DIR/quickstart.log
#   (default OUT_DIR /tmp/quickstart-cold; COLD_RUN_REF: run that commit instead of HEAD)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/quickstart-cold}
export OPSCTL_LAB_SLOT=${OPSCTL_LAB_SLOT:-9}
if [ "${COLD_RUN_NS:-}" != 1 ]; then
  exec env COLD_RUN_NS=1 unshare --mount --propagation private bash "$0" "$@"
fi
work=$(mktemp -d /var/tmp/quickstart-XXXXXX)  # on the disk the caches use (not a tmpfs)
mkdir -p "$out" "$work/cache" "$work/lib" "$work/state" /var/cache/opsctl /var/lib/opsctl
mount --bind "$work/cache" /var/cache/opsctl
mount --bind "$work/lib" /var/lib/opsctl
git clone -q "$repo" "$work/opsctl"
if [ -n "${COLD_RUN_REF:-}" ]; then git -C "$work/opsctl" checkout -q "$COLD_RUN_REF"; fi  # e.g. to time the code before a change
python3 -m venv "$work/venv"
echo "cold run: clone $work/opsctl, venv $work/venv, slot $OPSCTL_LAB_SLOT, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
set +e
(
  cd "$work/opsctl"
  export PATH="$work/venv/bin:$PATH" PIP_NO_CACHE_DIR=1 XDG_STATE_HOME="$work/state"
  # CPU seconds of setup and of the journey's control-side processes (the lab hosts' are not counted): on
  # 2 cores a step cannot take less than half of what it uses
  /usr/bin/time -f "cold run: setup used %U s user + %S s system CPU in %e s" bash scripts/setup &&
    /usr/bin/time -f "cold run: the journey (control side) used %U s user + %S s system CPU in %e s" \
      bash scripts/lab-journey
) 2>&1 | python3 "$repo/dev/quickstart/stamp.py" "$out/quickstart.log"
rc=${PIPESTATUS[0]}
set -e
echo "cold run: exit $rc, load after $(cut -d' ' -f1-3 /proc/loadavg); $out/quickstart.log" >&2
(cd "$work/opsctl" && PATH="$work/venv/bin:$PATH" opsctl lab down >/dev/null 2>&1) || echo "cold run: lab down failed" >&2
umount /var/lib/opsctl /var/cache/opsctl
if [ "${KEEP_WORK:-0}" != 1 ]; then rm -rf "$work"; fi
tail -25 "$out/quickstart.log" >&2
exit "$rc"
