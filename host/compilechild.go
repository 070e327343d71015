package host

import (
	"context"
	"fmt"

	"github.com/moehost/moehost/host/internal/sandbox"
)

// CompileChildMain runs this process as a compile child when args (the
// process's arguments less the binary's name) ask for one, and returns its
// exit code and true; otherwise it returns false at once. A binary whose
// servers use WithCompileInChild must call it first thing in main.
func CompileChildMain(args []string) (int, bool) { return sandbox.ChildMain(args) }

// WithCompileInChild makes the server compile uploaded and deployed
// modules in a child process under a memory limit and a timeout, so that
// the compile's allocations and garbage collection stay out of the
// server: argv, or this binary when argv is empty, re-run with the
// arguments that CompileChildMain takes, which its main must call first.
// The child hands the machine code over through the compilation cache,
// which the server then loads instead of compiling again. Default:
// modules compile in the process (see RATIONALE). An option, not a
// process global, so that servers in one process choose apart; a binary
// that cannot be found fails Start.
func WithCompileInChild(argv ...string) Option {
	opt := sandbox.WithCompileChild(argv...)
	return optionFunc(func(c *config) { c.compileChild = []sandbox.CacheOption{opt} })
}

// Precompile compiles modules into the compilation cache in dir, so that
// servers sharing it (WithCompileCache) start without compiling them: at
// an image's build, say, or before a test run. Each module is checked as
// an upload is, under the default guest limits, which are what a server's
// cache entries are made under too.
func Precompile(ctx context.Context, dir string, wasm ...[]byte) error {
	rt, err := sandbox.NewRuntime(ctx, dir, sandbox.Limits{})
	if err != nil {
		return err
	}
	defer rt.Close(ctx)
	for i, w := range wasm {
		m, err := rt.Compile(ctx, w)
		if err != nil {
			return fmt.Errorf("module %d of %d: %w", i+1, len(wasm), err)
		}
		m.Close(ctx)
	}
	return nil
}
