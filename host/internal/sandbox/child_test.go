package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/internal/testing/racebuild"
	"github.com/moehost/moehost/modules"
)

// TestMain lets the test binary serve as its own compile child.
func TestMain(m *testing.M) {
	if code, ok := ChildMain(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestCompileInChild compiles the Go ffn example in a child, and checks
// that the server's heap saw a small part of what an in-process compile
// allocates: the child's compile fills the file cache, and the parent's
// compile reads the code back.
func TestCompileInChild(t *testing.T) {
	skipUnderRace(t)
	ctx := context.Background()
	compile := func(child bool) uint64 {
		var opts []CacheOption
		if child {
			opts = append(opts, WithCompileChild())
		}
		rt, err := NewRuntime(ctx, t.TempDir(), Limits{}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close(ctx)
		n := AllocatedDuring(func() { _, err = rt.Compile(ctx, wasmexperts.FFN) })
		if err != nil {
			t.Fatalf("child %v: %v", child, err)
		}
		return n
	}
	in, out := compile(false), compile(true)
	t.Logf("heap allocated by the server compiling ffn.wasm (%d bytes): in process %d MiB, with a child %d MiB",
		len(wasmexperts.FFN), in>>20, out>>20)
	if out*4 > in {
		t.Errorf("a child compile still allocated %d bytes in the server, an in-process one %d: want a quarter at most", out, in)
	}
}

// TestCompileChildRefuses gives the child too little memory for ffn.wasm:
// the module is refused as invalid, naming the limit, and the runtime
// still compiles modules afterwards.
func TestCompileChildRefuses(t *testing.T) {
	skipUnderRace(t)
	ctx := context.Background()
	defer func(b int64) { childBaseBytes = b }(childBaseBytes)
	childBaseBytes = -200 << 20 // ffn is charged about 240 MiB
	rt, err := NewRuntime(ctx, t.TempDir(), Limits{}, WithCompileChild())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	_, err = rt.Compile(ctx, wasmexperts.FFN)
	if !errors.Is(err, ErrInvalidModule) || !strings.Contains(err.Error(), "memory limit of") {
		t.Fatalf("compiling ffn.wasm in too little memory: %v, want ErrInvalidModule naming the limit", err)
	}
	t.Log(err)
	if hasReceipt(rt.cache.dir, modules.Digest(wasmexperts.FFN)) {
		t.Fatal("a refused compile left a receipt, so the next compile would skip the child")
	}
	childBaseBytes = childBase
	if _, err := rt.Compile(ctx, wasmexperts.Nop); err != nil {
		t.Fatalf("compiling nop after a refusal: %v", err)
	}
}

// skipUnderRace skips a test that compiles the Go examples in a compile
// child, or the adversarial shapes, in race builds, where the child is
// the race-built test binary and each compile took minutes of CPU beside
// the rest of make test. The detector has nothing to watch there: a
// compile runs on one goroutine, or in another process. Such a test's
// name starts with TestCompile, which is what make test-compile runs
// without the detector.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if racebuild.Enabled {
		t.Skip("compiles the Go examples: make test runs it without -race (make test-compile)")
	}
}

// TestCompileReceiptSkipsChild compiles one module into one cache from
// several runtimes: the first compile runs a child and leaves a receipt,
// later ones skip the child; without the receipt the child runs again,
// and a receipt whose cache entry is gone still compiles (in the
// process).
func TestCompileReceiptSkipsChild(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	digest := modules.Digest(wasmexperts.FFNC)
	compile := func() int64 {
		t.Helper()
		rt, err := NewRuntime(ctx, dir, Limits{}, WithCompileChild())
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close(ctx)
		before := childRuns.Load()
		m, err := rt.Compile(ctx, wasmexperts.FFNC)
		if err != nil {
			t.Fatal(err)
		}
		m.Close(ctx)
		return childRuns.Load() - before
	}
	if n := compile(); n != 1 {
		t.Fatalf("a cold compile ran %d children, want 1", n)
	}
	if !hasReceipt(dir, digest) {
		t.Fatal("a compile left no receipt")
	}
	if n := compile(); n != 0 {
		t.Fatalf("a compile with a receipt ran %d children, want none", n)
	}
	if err := os.RemoveAll(filepath.Join(dir, receiptDir)); err != nil {
		t.Fatal(err)
	}
	if n := compile(); n != 1 {
		t.Fatalf("a compile without its receipt ran %d children, want 1", n)
	}
	// wazero's entries gone, the receipt kept: the process compiles.
	entries, _ := filepath.Glob(filepath.Join(dir, "wazero-*"))
	for _, e := range entries {
		if err := os.RemoveAll(e); err != nil {
			t.Fatal(err)
		}
	}
	if n := compile(); n != 0 {
		t.Fatalf("a compile with a receipt ran %d children, want none", n)
	}
}

// TestCompileParentReadsChildsEntry checks that the process loads what
// its compile child compiled rather than compiling the module again.
// wazero's file cache writes an entry only on a miss, as a temp file
// renamed over the entry's name; so once a child has filled the cache,
// a Compile (whose own child, with no receipt yet, reads the entry) must
// leave every file of it as it was: a new file or a replaced one is a
// compile in the process.
func TestCompileParentReadsChildsEntry(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rt, err := NewRuntime(ctx, dir, Limits{}, WithCompileChild())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	wasm := wasmexperts.FFNC
	shape, err := inspect(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.compileInChild(ctx, wasm, shape, modules.Digest(wasm)); err != nil {
		t.Fatal(err)
	}
	entries := func() map[string]os.FileInfo {
		t.Helper()
		out := map[string]os.FileInfo{}
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				if d != nil && d.Name() == receiptDir {
					return filepath.SkipDir
				}
				return err
			}
			fi, err := d.Info()
			out[path] = fi
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := entries()
	if len(before) == 0 {
		t.Fatal("the compile child left nothing in the cache")
	}
	runs := childRuns.Load()
	m, err := rt.Compile(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	m.Close(ctx)
	if n := childRuns.Load() - runs; n != 1 {
		t.Errorf("Compile ran %d children, want 1", n)
	}
	after := entries()
	for path, fi := range after {
		switch b, ok := before[path]; {
		case !ok:
			t.Errorf("the process compiled the module again: it wrote %s", path)
		case !os.SameFile(b, fi):
			t.Errorf("the process compiled the module again: it replaced %s", path)
		}
	}
	if len(after) != len(before) {
		t.Errorf("the cache held %d files after the child, %d after Compile", len(before), len(after))
	}
}
