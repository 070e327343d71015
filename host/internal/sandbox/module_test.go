package sandbox_test

import (
	"context"
	"embed"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// badModules break the ABI in one way each.
//
// Rebuild: for f in testdata/bad_*.wat; do wat2wasm $f -o ${f%.wat}.wasm; done
//
//go:embed testdata/bad_*.wasm
var badModules embed.FS

func TestInvalidModulesAreRefused(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{MemoryPages: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	tests := []struct {
		file string // "" for raw bytes below
		raw  []byte
		msg  string
	}{
		{"bad_import.wasm", nil, `imports from module "env"`},
		{"bad_host_func.wasm", nil, "unknown host function moehost_v1.launch_missiles"},
		{"bad_version.wasm", nil, "returned 2"},
		{"bad_command.wasm", nil, "build a Go expert with -buildmode=c-shared"},
		{"bad_no_forward.wasm", nil, `missing export "moe_forward"`},
		{"bad_empty_schema.wasm", nil, "at least one of each"},
		{"bad_init_trap.wasm", nil, "unreachable"},
		{"bad_memory.wasm", nil, "memory"},
		{"", []byte("not wasm at all"), "invalid expert module"},
		{"", nil, "invalid expert module"},
	}
	for _, tt := range tests {
		name := tt.file
		if name == "" {
			name = "raw " + string(tt.raw)
		}
		t.Run(name, func(t *testing.T) {
			wasm := tt.raw
			if tt.file != "" {
				if wasm, err = badModules.ReadFile("testdata/" + tt.file); err != nil {
					t.Fatal(err)
				}
			}
			m, err := rt.Compile(ctx, wasm)
			if err == nil {
				dev := gpuhost.NewCPU(1)
				var inst *sandbox.Instance
				inst, err = m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, nil, 0)})
				if err == nil {
					inst.Close(ctx)
				}
			}
			if !errors.Is(err, sandbox.ErrInvalidModule) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want ErrInvalidModule with %q", err, tt.msg)
			}
		})
	}
}

// TestCommandRefusedBeforeCompile: a WASI command is refused from its
// export section, before any compile: the runtime's compile child is a
// program that cannot start, so a module that reached the compile would
// fail with that instead (a real child costs a process start that other
// tenants' calls felt on a loaded box).
func TestCommandRefusedBeforeCompile(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, t.TempDir(), sandbox.Limits{}, sandbox.WithCompileChild(filepath.Join(t.TempDir(), "no-such-child")))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	wasm, err := badModules.ReadFile("testdata/bad_command.wasm")
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.Compile(ctx, wasm)
	if !errors.Is(err, sandbox.ErrInvalidModule) || !strings.Contains(err.Error(), "the module is a WASI command") {
		t.Fatalf("got %v, want ErrInvalidModule naming a WASI command", err)
	}
}

// FuzzCompile feeds arbitrary bytes to module validation and
// instantiation: they must fail cleanly, never panic.
func FuzzCompile(f *testing.F) {
	f.Add(probeWasm)
	entries, _ := badModules.ReadDir("testdata")
	for _, e := range entries {
		b, _ := badModules.ReadFile("testdata/" + e.Name())
		f.Add(b)
	}
	// The shapes that drive the compiler's memory and time (the locals
	// bomb and its friends), which the module reader refuses.
	shapes, _ := filepath.Glob("testdata/shape_*.wasm")
	for _, p := range shapes {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{MemoryPages: 16, InitTimeout: 100 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rt.Close(ctx) })
	dev := gpuhost.NewCPU(1)
	f.Fuzz(func(t *testing.T, wasm []byte) {
		m, err := rt.Compile(ctx, wasm)
		if err != nil {
			return
		}
		defer m.Close(ctx)
		inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, nil, 1<<20)})
		if err == nil {
			inst.Close(ctx)
		}
	})
}
