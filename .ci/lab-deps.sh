#!/bin/sh
# Debian packages the lab tier needs (`opsctl lab up`: systemd-nspawn, mmdebstrap, ip, ssh, rsync).
# Run as root; called by .ci/run before the lab tier. Idempotent: installs only what is missing.
set -eu
LAB_PACKAGES="systemd-container mmdebstrap iproute2 openssh-client rsync"
missing=""
for pkg in $LAB_PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    echo "lab-deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    apt-get install -y -qq --no-install-recommends $missing
fi
