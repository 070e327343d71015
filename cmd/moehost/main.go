// Command moehost hosts Mixture-of-Experts experts compiled to WebAssembly.
// See `moehost help`.
package main

import (
	"os"

	"github.com/moehost/moehost/cmd/moehost/internal/cli"
	"github.com/moehost/moehost/host"
)

func main() {
	// A compile child (host.WithCompileInChild) runs before anything else.
	if code, ok := host.CompileChildMain(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
