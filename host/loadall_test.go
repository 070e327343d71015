package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// TestStartLoadsExpertsSideBySide starts eight experts of one module and
// config, loaded four at a time: they share one instance all the same
// (the loads that would share it wait for the one that starts it), and a
// start whose sixth expert fails returns that expert's own error, not the
// cancellation it caused the others (an expert listed before it, whose
// moe_init spins, among them).
func TestStartLoadsExpertsSideBySide(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	cfg := map[string]int64{"hidden_dim": 8}
	var experts []ExpertConfig
	for i := range 8 {
		experts = append(experts, ExpertConfig{UID: fmt.Sprintf("p.%d", i), Module: ModuleBytes(wasmexperts.FFNC), Config: cfg})
	}
	srv := startTestServer(t, WithExperts(experts...))
	slot := srv.expert("p.0").InstanceKey()
	for _, ec := range experts {
		if e := srv.expert(ec.UID); e == nil || e.InstanceKey() != slot {
			t.Fatalf("%s is not on p.0's instance", ec.UID)
		}
	}
	if n := srv.expert("p.0").InstanceUsers(); n != len(experts) {
		t.Fatalf("the shared instance has %d users, want %d", n, len(experts))
	}

	// p.5 fails at once; the expert listed first spins in its moe_init
	// until the failure cancels it.
	experts[5].Config = map[string]int64{"hidden_dim": 8, "hiden_dim": 8}
	experts = append([]ExpertConfig{{UID: "spin.0", Module: ModuleBytes(spinInit)}}, experts...)
	bad, err := New(WithListen("127.0.0.1:*"), WithDataDir(t.TempDir()), WithExperts(experts...), WithGuestLimits(GuestLimits{InitTimeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = bad.Start(ctx)
	if !errors.Is(err, sandbox.ErrUnknownConfigKey) || !strings.Contains(err.Error(), "hiden_dim") {
		t.Fatalf("a start whose p.5 has an unknown config key: %v, want p.5's own error", err)
	}
}
