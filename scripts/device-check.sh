#!/usr/bin/env bash
# device-check.sh builds, here, what the device check runs on a GPU
# machine (which has no Go), and prints the command to run there.
#
# The binaries go to .tmp/device-check (ignored by git, so the device
# tool must carry it): gpuhost's tests with the CUDA device in the
# device table (tag cuda), the driver's tests and GEMM benchmark, and
# host's tests for the ffn benchmark, gzipped (it embeds the example
# experts). All are stripped, so that they and the tree fit the 64 MiB
# the tool carries. scripts/device-run.sh runs them there in under five
# minutes, with scripts/torch_cuda_peer.py as PyTorch's side.
#
# GOFLAGS=-tags=cudaemu builds the same binaries on the CPU emulator,
# and `scripts/device-run.sh --small` runs them here at small sizes: a
# smoke test of everything but the GPU and PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=.tmp/device-check
tags=cuda
case "${GOFLAGS:-}" in *cudaemu*) tags=cudaemu ;; esac
if [ "$tags" = cuda ]; then
	./scripts/install-cuda-toolkit.sh
fi
rm -rf "$dir"
mkdir -p "$dir"
build() { # build OUT PKG
	echo "go test -c -tags $tags $2 -> $dir/$1"
	GOFLAGS= go test -c -tags "$tags" -trimpath -ldflags='-s -w' -o "$dir/$1" "$2"
}
build gpuhost.test ./gpuhost/
build cuda.test ./gpuhost/internal/cuda/
build host.test ./host/
gzip -9 "$dir/host.test"
echo "$tags" >"$dir/tags"
git rev-parse HEAD >"$dir/commit" 2>/dev/null || true
du -ch "$dir"/* | tail -1 | sed 's/\ttotal/ in '"${dir//\//\\/}"'/'
echo
echo "On the GPU machine (device tool: carry [\"$dir\"], timeout_s 420):"
echo "  scripts/device-run.sh"
