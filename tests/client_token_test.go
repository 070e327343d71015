package tests

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/sdk/client"
)

// TestTenantTrainsFromGoClient runs `moehost serve --tenants`, deploys a
// tenant's expert (Backward owner-only, the default), and trains it from
// sdk/client: with WithToken or $MOEHOST_TOKEN, over Connect and gRPC,
// and through a MixtureOfExperts, Backward succeeds and the expert's
// answer to the same input changes; with no token it is Unauthenticated,
// names the way out, and the expert is unchanged.
func TestTenantTrainsFromGoClient(t *testing.T) {
	ctx := context.Background()
	bin := buildMoehost(t, "")
	dataDir := t.TempDir()
	file := filepath.Join(dataDir, "tenants.json")
	alice := addTenant(t, bin, file, "alice", "alice")
	h := startTenantsHost(t, bin, dataDir, file)
	h.deployAliceFFN(ctx, t, alice)

	const uid = "alice.ffn.0"
	x := client.Float32([]int64{1, 8}, []float32{1, -2, 3, -4, 5, -6, 7, -8})
	dy := client.Float32([]int64{1, 8}, []float32{1, 1, 1, 1, 1, 1, 1, 1})
	forward := func() []float32 {
		t.Helper()
		c := client.New(h.url, client.WithToken(alice))
		defer c.Close()
		out, err := c.Expert(uid).Forward(ctx, x)
		if err != nil {
			t.Fatalf("forward: %v", err)
		}
		v, err := out[0].Float32s()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	tests := []struct {
		name  string
		env   string // $MOEHOST_TOKEN
		opts  []client.Option
		moe   bool // train through a MixtureOfExperts
		train bool // false: Unauthenticated
	}{
		{name: "no token", train: false},
		{name: "WithToken", opts: []client.Option{client.WithToken(alice)}, train: true},
		{name: "WithToken over gRPC", opts: []client.Option{client.WithToken(alice), client.WithGRPC()}, train: true},
		{name: "$MOEHOST_TOKEN", env: alice, train: true},
		{name: "WithToken empty overrides $MOEHOST_TOKEN", env: alice, opts: []client.Option{client.WithToken("")}, train: false},
		{name: "mixture with WithToken", opts: []client.Option{client.WithToken(alice)}, moe: true, train: true},
		{name: "mixture with no token", moe: true, train: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(client.TokenEnv, tt.env)
			before := forward()
			var err error
			if tt.moe {
				dir := fixedDirectory{uid: uid, url: h.url}
				moe, merr := client.NewMixtureOfExperts(dir, client.MoEConfig{Prefix: "alice.ffn", K: 1}, tt.opts...)
				if merr != nil {
					t.Fatal(merr)
				}
				defer moe.Close()
				out, ferr := moe.Forward(ctx, x, [][][]float64{{{1}}})
				if ferr != nil {
					t.Fatalf("mixture forward: %v", ferr)
				}
				_, _, err = moe.Backward(ctx, out, dy)
			} else {
				c := client.New(h.url, tt.opts...)
				defer c.Close()
				var gx []client.Tensor
				gx, err = c.Expert(uid).Backward(ctx, []client.Tensor{x}, []client.Tensor{dy})
				if err == nil && (len(gx) != 1 || !slices.Equal(gx[0].Shape, []int64{1, 8})) {
					t.Fatalf("backward returned %d gradients, want one [1 8]", len(gx))
				}
			}
			after := forward()
			if tt.train {
				if err != nil {
					t.Fatalf("backward with alice's token: %v", err)
				}
				if slices.Equal(before, after) {
					t.Fatalf("backward did not change the expert: %v both times", before)
				}
				return
			}
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Fatalf("backward with no token: %v, want Unauthenticated", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "needs a token") || !strings.Contains(msg, "its owner's") {
				t.Errorf("backward with no token: %q does not name the way out (its owner's token)", msg)
			}
			if !slices.Equal(before, after) {
				t.Errorf("a refused backward changed the expert: %v, then %v", before, after)
			}
		})
	}
}

// fixedDirectory is a Directory that knows one expert on one server, for
// a mixture over a server without a DHT.
type fixedDirectory struct{ uid, url string }

func (d fixedDirectory) eps() map[string][]client.Endpoint {
	return map[string][]client.Endpoint{d.uid: {{URL: d.url}}}
}

func (d fixedDirectory) Discover(context.Context, []string) (map[string][]client.Endpoint, error) {
	return d.eps(), nil
}

func (d fixedDirectory) DiscoverPages(_ context.Context, _ []string, yield func(map[string][]client.Endpoint) bool) error {
	yield(d.eps())
	return nil
}

func (d fixedDirectory) BeamSearch(context.Context, string, [][]float64, int, []string) ([]client.Choice, error) {
	return []client.Choice{{UID: d.uid, Endpoints: []client.Endpoint{{URL: d.url}}}}, nil
}
