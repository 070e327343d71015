#!/usr/bin/env bash
# install-python-torch.sh installs, from Debian's own archive, what
# `make test-python-interop` needs: python3-torch and python3-numpy (Debian
# 12 ships torch 1.13). It is idempotent: nothing is fetched when the
# system Python already imports both.
#
# apt-install.sh retries a slow mirror and fails only when every attempt
# does, so that the interop test is never silently skipped.
set -euo pipefail

PYTHON=${PYTHON:-/usr/bin/python3}
PACKAGES=(python3-torch python3-numpy)

if "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
	echo "install-python-torch: $PYTHON already imports torch and numpy"
	exit 0
fi
"$(dirname "$0")/apt-install.sh" install-python-torch "${PACKAGES[@]}"
"$PYTHON" -c 'import torch, numpy; print("install-python-torch: torch", torch.__version__)'
