#!/usr/bin/env bash
# install-python-torch.sh installs, from Debian's own archive, what
# `make test-python-interop` needs: python3-torch and python3-numpy (Debian
# 12 ships torch 1.13). It is idempotent: nothing is fetched when the
# system Python already imports both.
#
# A slow mirror is not a failure: apt retries each download, the whole
# install is tried again with a growing pause, and nothing is timed out.
# Only an install that fails every attempt fails the script, so that the
# interop test is never silently skipped.
set -euo pipefail

PYTHON=${PYTHON:-/usr/bin/python3}
PACKAGES=(python3-torch python3-numpy)

if "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
	echo "install-python-torch: $PYTHON already imports torch and numpy"
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "install-python-torch: apt-get not found; install ${PACKAGES[*]} (Debian package names) by hand" >&2
	exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
	sudo=(sudo)
fi
apt_opts=(-o Acquire::Retries=10 -o Acquire::http::Timeout=300 -o DPkg::Lock::Timeout=600)
for attempt in 1 2 3 4 5; do
	if "${sudo[@]}" apt-get "${apt_opts[@]}" update &&
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get "${apt_opts[@]}" install -y --no-install-recommends "${PACKAGES[@]}"; then
		"$PYTHON" -c 'import torch, numpy; print("install-python-torch: torch", torch.__version__)'
		exit 0
	fi
	echo "install-python-torch: attempt $attempt failed; trying again in $((attempt * 30))s" >&2
	sleep $((attempt * 30))
done
echo "install-python-torch: could not install ${PACKAGES[*]}" >&2
exit 1
