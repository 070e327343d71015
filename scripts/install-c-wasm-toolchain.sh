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
# It is idempotent (see apt-install.sh). It uses apt-get only; no other download
# source. Run it as root (or with sudo available).
set -euo pipefail

exec "$(dirname "$0")/apt-install.sh" install-c-wasm-toolchain clang lld wasi-libc libclang-rt-dev-wasm32
