#!/usr/bin/env bash
# gen-python-stubs.sh generates the Python protobuf and gRPC stubs of
# proto/ into sdk/python/moehost/v1/ (ignored by git), with Debian's
# python3-grpc-tools (scripts/install-python-deps.sh installs it). The
# generated modules import each other as moehost.v1.*, which is where they
# land inside the moehost package.
#
# Debian's grpc-tools (1.14, protoc 3.6) predates proto3 `optional`, so
# the files that use it (checkpoint.proto) are not compiled here: their
# stubs are written from the compiled descriptors the server embeds
# (host/internal/rpc/descriptors.binpb, kept fresh by make checkgenerate) by
# scripts/python_stubs_from_descriptors.py, with `optional` intact.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
out=sdk/python
include=$("$PYTHON" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
rm -rf "$out/moehost/v1"
"$PYTHON" -m grpc_tools.protoc -I proto -I "$include" \
	--python_out="$out" --grpc_python_out="$out" \
	moehost/v1/tensor.proto moehost/v1/expert.proto moehost/v1/discovery.proto
"$PYTHON" scripts/python_stubs_from_descriptors.py host/internal/rpc/descriptors.binpb "$out" moehost/v1/checkpoint.proto
printf '"""Generated protobuf and gRPC stubs of moehost.v1 (scripts/gen-python-stubs.sh)."""\n' >"$out/moehost/v1/__init__.py"
echo "gen-python-stubs: $(ls "$out/moehost/v1" | grep -c '_pb2') modules in $out/moehost/v1"
