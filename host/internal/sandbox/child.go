package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
)

// ChildCommand is the hidden first argument that makes a binary a compile
// child (see ChildMain).
const ChildCommand = "__compile-module"

// childBase is what a compile child's memory limit allows beyond the
// module's compileCost: the Go runtime, the binary's own data and the
// decoded module, with room for the collector's slack (measured: the
// moehost binary compiling examples' ffn.wasm, charged 240 MiB, needs
// a limit of 192 MiB, about 45 of them the binary's data and bss).
const childBase = 256 << 20

// childBaseBytes is childBase; tests lower it.
var childBaseBytes int64 = childBase

// childRuns counts the compile children started, for tests.
var childRuns atomic.Int64

// WithCompileChild makes the runtimes that use a Cache compile each
// module in a child process first, into the cache's directory, so that
// the compile's allocations and garbage collection stay out of the
// server: argv (the running binary when empty) is started with
// ChildCommand and its arguments, and must call ChildMain before anything
// else. Only a binary that does so may ask for it: a library user's
// binary (a test's, say) would run itself instead. It is an option of the
// cache, not of the process, so that two servers in one process (tests,
// an embedder) may choose apart, and because a child can only hand its
// work over through a file cache. Default: compiles run in the process.
func WithCompileChild(argv ...string) CacheOption {
	argv = append([]string(nil), argv...)
	return cacheOption(func(c *Cache) { c.child = argv; c.wantChild = true })
}

// resolveChild fills in the running binary where WithCompileChild named
// none.
func (c *Cache) resolveChild() error {
	if !c.wantChild || len(c.child) > 0 {
		return nil
	}
	exe, err := selfExe()
	if err != nil {
		return fmt.Errorf("finding the running binary for compile children: %w", err)
	}
	c.child = []string{exe}
	return nil
}

// errChildStart: the host could not run a compile child, which is no
// fault of the module.
var errChildStart = errors.New("starting a compile child")

// compileInChild compiles wasm (of digest) in a child process into the
// runtime's file cache, under a memory limit of the shape's compileCost
// plus childBase and the module limits' CompileTimeout. It does nothing
// when compiles run in the process, the runtime has no file cache, or the
// cache holds the module's compile receipt: then the child's compile would
// only read the cache, as the process's own does next.
func (rt *Runtime) compileInChild(ctx context.Context, wasm []byte, shape *moduleShape, digest string) error {
	if rt.cache == nil || len(rt.cache.child) == 0 || rt.cache.dir == "" {
		return nil
	}
	argv := rt.cache.child
	if hasReceipt(rt.cache.dir, digest) {
		return nil
	}
	childRuns.Add(1)
	limit := (shape.compileCost() + childBaseBytes) * childRaceFactor
	timeout := rt.limits.Module.CompileTimeout
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := append(argv[1:len(argv):len(argv)], ChildCommand, rt.cache.dir,
		strconv.FormatInt(limit, 10), strconv.FormatUint(uint64(rt.limits.MemoryPages), 10))
	cmd := exec.CommandContext(cctx, argv[0], args...)
	// One core for the compile and its collector; the child inherits
	// nice 19 from the thread that starts it (lowPriority).
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stdin = bytes.NewReader(wasm)
	stderr := &headBuffer{max: 4 << 10}
	cmd.Stderr = stderr
	cmd.WaitDelay = time.Second
	start := time.Now()
	err := cmd.Run()
	switch {
	case err == nil:
		return nil
	case cctx.Err() != nil && ctx.Err() == nil:
		return fmt.Errorf("compiling took more than %s (the compile time limit)", timeout)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return fmt.Errorf("%w: %w", errChildStart, err)
	}
	msg := stderr.firstLines(4)
	switch exit.ExitCode() {
	case childRefused:
		return errors.New(msg)
	case childBroken:
		return fmt.Errorf("%w: %s", errChildStart, msg)
	}
	// The child died: under RLIMIT_DATA the Go runtime fails an mmap
	// with "out of memory" or, in places, a SIGSEGV; a signal or any
	// other crash of the compiler is the module's too.
	return fmt.Errorf("the compile failed under its memory limit of %d bytes (this shape's compile charge plus %d%s) after %s: %s",
		limit, childBaseBytes, raceNote, time.Since(start).Round(time.Millisecond), deathNote(stderr.firstLines(1), exit))
}

// Exit codes of a compile child: the module does not compile (the message
// is on stderr), or the child could not set itself up (its arguments, its
// memory limit, the cache directory). The Go runtime exits with 2.
const (
	childRefused = 3
	childBroken  = 4
)

// ChildMain runs a compile child when args (the process's arguments, less
// the binary's name) start with ChildCommand, and returns its exit code
// and true; otherwise it returns false at once. The child reads a module
// from stdin and compiles it into the cache directory named by its
// arguments, under the memory limit they give.
func ChildMain(args []string) (int, bool) {
	if len(args) == 0 || args[0] != ChildCommand {
		return 0, false
	}
	if len(args) != 4 {
		fmt.Fprintf(os.Stderr, "%s: want a cache directory, a memory limit and memory pages\n", ChildCommand)
		return childBroken, true
	}
	limit, err1 := strconv.ParseInt(args[2], 10, 64)
	pages, err2 := strconv.ParseUint(args[3], 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", ChildCommand, err)
		return childBroken, true
	}
	if err := limitMemory(limit); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", ChildCommand, err)
		return childBroken, true
	}
	// Collect hard before the limit rather than die at it.
	debug.SetMemoryLimit(limit - limit/8)
	wasm, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: reading the module: %v\n", ChildCommand, err)
		return childBroken, true
	}
	ctx := context.Background()
	cache, err := wazero.NewCompilationCacheWithDir(args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", ChildCommand, err)
		return childBroken, true
	}
	r := wazero.NewRuntimeWithConfig(ctx, runtimeConfig(Limits{MemoryPages: uint32(pages)}.WithDefaults()).WithCompilationCache(cache))
	_, err = r.CompileModule(ctx, wasm)
	_ = r.Close(ctx)
	_ = cache.Close(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return childRefused, true
	}
	return 0, true
}

// deathNote is the first line of a dead child's stderr, or how it exited
// when it wrote nothing.
func deathNote(line string, exit *exec.ExitError) string {
	if line != "" {
		return line
	}
	return exit.String()
}
