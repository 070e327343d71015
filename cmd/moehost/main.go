// Command moehost hosts Mixture-of-Experts experts compiled to WebAssembly.
// See `moehost help`.
package main

import (
	"os"

	"github.com/moehost/moehost/cmd/moehost/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
