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
# It is idempotent (see apt-install.sh). It uses apt-get only (no PyPI). Run it as
# root (or with sudo available).
set -euo pipefail

exec "$(dirname "$0")/apt-install.sh" install-python-deps python3-torch python3-grpcio python3-grpc-tools python3-numpy
