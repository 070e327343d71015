package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
)

// compileCmd fills a compilation cache ahead of time: servers that share
// it (--compile-cache) then start without compiling, which matters for a
// container image and for a test run that starts many servers.
func compileCmd(stdout io.Writer) *cobra.Command {
	var dataDir, cache string
	cmd := &cobra.Command{
		Use:   "compile [module...]",
		Short: "Compile modules (.wasm files or built-in examples; all built-ins by default) into the compilation cache",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = wasmexperts.BuiltinNames()
			}
			dir := host.CompileCacheDir(dataDir, cache)
			for _, name := range args {
				wasm, ok := wasmexperts.Builtin(name)
				if !ok {
					var err error
					if wasm, err = os.ReadFile(name); err != nil {
						return fmt.Errorf("module %q: not a built-in (%v), and %w", name, wasmexperts.BuiltinNames(), err)
					}
				}
				start := time.Now()
				if err := host.Precompile(cmd.Context(), dir, wasm); err != nil {
					return fmt.Errorf("compiling %s: %w", name, err)
				}
				fmt.Fprintf(stdout, "%s\t%d bytes\tcompiled in %s\n", name, len(wasm), time.Since(start).Round(time.Millisecond))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", host.DefaultDataDir, "the server's data dir, whose cache/wazero is the default cache")
	f.StringVar(&cache, "compile-cache", "", "the cache directory (default $"+host.CompileCacheEnv+", else cache/wazero in the data dir)")
	return cmd
}
