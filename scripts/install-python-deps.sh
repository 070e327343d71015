#!/usr/bin/env bash
# install-python-deps.sh installs, from Debian's own archive, what the
# Python client (sdk/python) and `make test-python` need:
#
#   python3-torch       PyTorch (nn.Module, autograd.Function)
#   python3-grpcio      the gRPC runtime the client calls the server with
#   python3-protobuf    the protobuf runtime its stubs (sdk/python/moehost/v1,
#                       committed) load with
#   python3-numpy       tensor bytes to and from torch
#   python3-venv        python3 -m venv, for `pip install ./sdk/python`
#                       into a virtual environment
#   python3-setuptools  the build backend sdk/python/pyproject.toml names,
#   python3-wheel       and what it builds the wheel with (pip install
#                       --no-build-isolation uses the installed ones)
#
# It is idempotent (see apt-install.sh). It uses apt-get only (no PyPI). Run it as
# root (or with sudo available).
set -euo pipefail

exec "$(dirname "$0")/apt-install.sh" install-python-deps python3-torch python3-grpcio python3-protobuf python3-numpy python3-venv python3-setuptools python3-wheel
