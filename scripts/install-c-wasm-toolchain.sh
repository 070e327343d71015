#!/usr/bin/env bash
# install-c-wasm-toolchain.sh installs, from Debian's own archive, what
# `make examples-c` needs to build C experts for wasm32-wasi:
#
#   clang                   the compiler (Debian's default LLVM, 14 on bookworm)
#   lld                     wasm-ld, the linker clang calls for wasm32
#   wasi-libc               the WASI sysroot (/usr/share/wasi-sysroot), with the
#                           reactor start file crt1-reactor.o
#   libclang-rt-dev-wasm32  compiler-rt builtins for wasm32, which clang links
#                           into every wasm32-wasi binary
#
# It is idempotent: packages already installed are skipped, and nothing is
# fetched when all are present. It uses apt-get only; no other download
# source. Run it as root (or with sudo available).
set -euo pipefail

PACKAGES=(clang lld wasi-libc libclang-rt-dev-wasm32)

missing=()
for p in "${PACKAGES[@]}"; do
	if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "install-c-wasm-toolchain: already installed: ${PACKAGES[*]}"
	exit 0
fi

if ! command -v apt-get >/dev/null; then
	echo "install-c-wasm-toolchain: apt-get not found; install ${missing[*]} (Debian/Ubuntu package names) by hand" >&2
	exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null; then
		echo "install-c-wasm-toolchain: need root (or sudo) to install ${missing[*]}" >&2
		exit 1
	fi
	sudo=(sudo)
fi

echo "install-c-wasm-toolchain: installing ${missing[*]}"
"${sudo[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
