// Package wasmexperts embeds the example experts, so that `moehost serve`
// has useful experts with no flags. Each sub-directory is a guest program;
// `make examples` rebuilds the .wasm files embedded here.
package wasmexperts

import _ "embed"

// FFN is hivemind's ffn expert (examples/wasm-experts/ffn).
//
// Rebuild: GOOS=wasip1 GOARCH=wasm go build -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared -o ffn/ffn.wasm ./ffn
//
//go:embed ffn/ffn.wasm
var FFN []byte
