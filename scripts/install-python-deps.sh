#!/usr/bin/env bash
# install-python-deps.sh installs, from Debian's own archive, what the
# Python client (sdk/python) and `make test-python` need:
#
#   python3-torch       PyTorch (nn.Module, autograd.Function)
#   python3-grpcio      the gRPC runtime the client calls the server with
#   python3-grpc-tools  protoc with the Python and gRPC plugins, which
#                       scripts/gen-python-stubs.sh runs to make the stubs
#   python3-numpy       tensor bytes to and from torch
#
# It is idempotent: packages already installed are skipped, and nothing is
# fetched when all are present. It uses apt-get only (no PyPI). Run it as
# root (or with sudo available).
set -euo pipefail

PACKAGES=(python3-torch python3-grpcio python3-grpc-tools python3-numpy)

missing=()
for p in "${PACKAGES[@]}"; do
	if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "install-python-deps: already installed: ${PACKAGES[*]}"
	exit 0
fi

if ! command -v apt-get >/dev/null; then
	echo "install-python-deps: apt-get not found; install ${missing[*]} (Debian/Ubuntu package names) by hand" >&2
	exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null; then
		echo "install-python-deps: need root (or sudo) to install ${missing[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi

echo "install-python-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
