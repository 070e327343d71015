package host

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
)

// TestDeployRefusesUnknownConfigKeys checks that a deployment whose config
// holds a key the module's moe_init does not read is InvalidArgument naming
// the keys it reads, instead of an expert silently on its defaults.
func TestDeployRefusesUnknownConfigKeys(t *testing.T) {
	ctx := context.Background()
	// Its own data dir: a deployment is saved there, and a server on the
	// shared one would restore typo.0 in other tests.
	srv := startTestServer(t, WithoutDHT())
	err := srv.Deploy(ctx, ExpertConfig{UID: "typo.0", Module: ModuleBytes(wasmexperts.FFNC), Config: map[string]int64{"hiden_dim": 4}})
	if errorCodes.Of(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `"hiden_dim": the module's moe_init does not read it (it reads: hidden_dim)`) {
		t.Fatalf("deploy with hiden_dim: %v, want InvalidArgument naming hidden_dim", err)
	}
	if _, ok := (table{srv.experts}).Expert("typo.0"); ok {
		t.Fatal("the refused expert is served")
	}
	if err := srv.Deploy(ctx, ExpertConfig{UID: "typo.0", Module: ModuleBytes(wasmexperts.FFNC), Config: map[string]int64{"hidden_dim": 4}}); err != nil {
		t.Fatalf("deploy with hidden_dim: %v", err)
	}
	// The test data dir is shared, and deployments persist in it.
	if err := srv.Undeploy(ctx, "typo.0"); err != nil {
		t.Fatal(err)
	}
}
