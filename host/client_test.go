package host_test

import (
	"context"
	"slices"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// TestClientProtocols calls one expert through sdk/client over each
// protocol and checks that they agree, and that errors keep their codes.
func TestClientProtocols(t *testing.T) {
	ctx := context.Background()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithExperts(host.ExpertConfig{UID: "nop.0", Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	// Two rows of distinct values, so that a protocol that drops, swaps
	// or rounds any element shows.
	x := []float32{1, -2, 3.5, 4, 1e-7, -3e5, 0.25, 7}
	gy := []float32{0.5, -1, 2, -4, 8e3, -1e-3, 9, 0}
	for _, tt := range []struct {
		name string
		opts []client.Option
	}{
		{"connect", nil},
		{"grpc", []client.Option{client.WithGRPC()}},
		{"grpc-web", []client.Option{client.WithGRPCWeb()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := client.New(srv.Addr(), tt.opts...)
			defer c.Close()
			// nop is the identity: its output is x and its input's
			// gradient the output's, element for element.
			out, err := c.Expert("nop.0").Forward(ctx, client.Float32([]int64{2, 4}, x))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := out[0].Float32s(); err != nil || !slices.Equal(got, x) {
				t.Fatalf("nop returned %v, %v; want %v", got, err, x)
			}
			grads, err := c.Expert("nop.0").Backward(ctx, []client.Tensor{client.Float32([]int64{2, 4}, x)}, []client.Tensor{client.Float32([]int64{2, 4}, gy)})
			if err != nil || len(grads) != 1 {
				t.Fatalf("backward: %v, %v", grads, err)
			}
			if got, err := grads[0].Float32s(); err != nil || !slices.Equal(got, gy) {
				t.Fatalf("nop's input gradient is %v, %v; want %v", got, err, gy)
			}
			infos, err := c.ListExperts(ctx)
			if err != nil || len(infos) != 1 || infos[0].GetUid() != "nop.0" {
				t.Fatalf("ListExperts: %v, %v", infos, err)
			}
			if _, err := c.Expert("nope").Info(ctx); connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("Info of an unknown uid: %v, want NotFound", err)
			}
		})
	}
}

func TestFloat32PanicsOnMismatch(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Float32 with 3 values for shape [2 2] did not panic")
		}
	}()
	client.Float32([]int64{2, 2}, []float32{1, 2, 3})
}
