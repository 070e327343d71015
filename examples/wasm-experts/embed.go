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

// FFNC is the ffn expert written in C (examples/wasm-experts/ffn-c). For one
// uid its outputs and gradients are bitwise equal to FFN's.
//
// Rebuild (make examples-c): clang --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -Werror -Wl,--strip-debug -o ffn-c/ffn-c.wasm ffn-c/ffn.c
//
//go:embed ffn-c/ffn-c.wasm
var FFNC []byte

// Nop is hivemind's nop expert, the identity (examples/wasm-experts/nop).
//
// Rebuild: GOOS=wasip1 GOARCH=wasm go build -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared -o nop/nop.wasm ./nop
//
//go:embed nop/nop.wasm
var Nop []byte

// NopDelay is hivemind's nop_delay expert, the identity after a sleep of
// delay_ms (default 500) per batch (examples/wasm-experts/nop_delay).
//
// Rebuild: GOOS=wasip1 GOARCH=wasm go build -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared -o nop_delay/nop_delay.wasm ./nop_delay
//
//go:embed nop_delay/nop_delay.wasm
var NopDelay []byte

// DetDropout is hivemind's det_dropout expert, with the dropout mask as an
// int64 input, as hivemind declares it (examples/wasm-experts/det_dropout).
//
// Rebuild: GOOS=wasip1 GOARCH=wasm go build -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared -o det_dropout/det_dropout.wasm ./det_dropout
//
//go:embed det_dropout/det_dropout.wasm
var DetDropout []byte

// Transformer is hivemind's transformer expert, an encoder layer with a key
// padding mask input (examples/wasm-experts/transformer).
//
// Rebuild: GOOS=wasip1 GOARCH=wasm go build -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared -o transformer/transformer.wasm ./transformer
//
//go:embed transformer/transformer.wasm
var Transformer []byte

// STEReLU is relu with a learned scale and a hand-written straight-through
// backward (examples/wasm-experts/ste_relu).
//
// Rebuild: GOOS=wasip1 GOARCH=wasm go build -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared -o ste_relu/ste_relu.wasm ./ste_relu
//
//go:embed ste_relu/ste_relu.wasm
var STEReLU []byte

// Builtin returns the embedded module called name: "ffn", "ffn-c", "nop",
// "nop_delay", "det_dropout", "transformer" or "ste_relu". All but ffn-c
// and ste_relu are hivemind's expert_cls names, for the same experts.
func Builtin(name string) ([]byte, bool) {
	m := map[string][]byte{"ffn": FFN, "ffn-c": FFNC, "nop": Nop, "nop_delay": NopDelay, "det_dropout": DetDropout, "transformer": Transformer, "ste_relu": STEReLU}[name]
	return m, m != nil
}

// Twins returns the other built-ins that are the same expert as name: the
// ffn in Go and in C, whose parameters, outputs and gradients are bitwise
// equal, so that each restores the other's checkpoints.
func Twins(name string) []string {
	switch name {
	case "ffn":
		return []string{"ffn-c"}
	case "ffn-c":
		return []string{"ffn"}
	}
	return nil
}

// BuiltinNames lists the names Builtin knows, in the order the docs give
// them.
func BuiltinNames() []string {
	return []string{"ffn", "ffn-c", "nop", "nop_delay", "det_dropout", "transformer", "ste_relu"}
}
