package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// TestUnknownConfigKeys checks that a config key moe_init never reads is
// refused, naming the keys it does read, while a key it reads (found or
// absent, for its default) is accepted.
func TestUnknownConfigKeys(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, "", sandbox.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	m, err := rt.Compile(ctx, wasmexperts.FFNC) // it reads hidden_dim, 1024 when absent
	if err != nil {
		t.Fatal(err)
	}
	dev := gpuhost.NewCPU(1)
	tests := []struct {
		name    string
		config  map[string]int64
		wantErr string // "" for success
	}{
		{"known", map[string]int64{"hidden_dim": 4}, ""},
		{"typo", map[string]int64{"hiden_dim": 4}, `"hiden_dim": the module's moe_init does not read it (it reads: hidden_dim)`},
		{"extra", map[string]int64{"hidden_dim": 4, "layers": 2, "heads": 1}, `"heads", "layers": the module's moe_init`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, []byte("x"), 0), Config: tt.config})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				inst.Close(ctx)
				return
			}
			if err == nil {
				inst.Close(ctx)
				t.Fatalf("config %v accepted", tt.config)
			}
			if !errors.Is(err, sandbox.ErrUnknownConfigKey) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("config %v: %v, want ErrUnknownConfigKey with %q", tt.config, err, tt.wantErr)
			}
		})
	}
}
