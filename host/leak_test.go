package host

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/internal/testing/racebuild"
)

// startTenantsServer starts a server with tenants alice and bob (prefixes
// their names) and returns it.
func startTenantsServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, tenant.FileName)
	f, err := tenant.LoadOrEmpty(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alice", "bob"} {
		if _, err := f.Add(name, []string{name}, tenant.Caps{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	return startTestServer(t, append([]Option{WithDataDir(dir), WithTenants(path)}, opts...)...)
}

// TestDeployCycleLeaks runs 200 cycles of upload, deploy, call, undeploy
// and delete through the ModuleService implementation: the heap and RSS
// return to within 10% of where they started, goroutines to the start,
// and no metric series or compiled module is left behind.
func TestDeployCycleLeaks(t *testing.T) {
	if testing.Short() {
		t.Skip("200 deploy cycles")
	}
	ctx := context.Background()
	srv := startTenantsServer(t)
	api := moduleAPI{srv}
	alice := rpc.Caller{Tenant: "alice"}
	dev := srv.Device()
	cycle := func(i int) {
		mod, err := api.Upload(ctx, alice, rpc.ModuleUpload{Name: "ffn-c", Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)})
		if err != nil {
			t.Fatal(err)
		}
		uid := "alice.ffn." + strconv.Itoa(i)
		if _, err := api.Deploy(ctx, alice, rpc.Deployment{Experts: uid, Module: mod.Digest,
			Config: map[string]int64{"hidden_dim": 32}, Forward: rpc.AccessPublic, Backward: rpc.AccessOwner}); err != nil {
			t.Fatal(err)
		}
		x := rows2(t, dev, 4, 32, make([]float32, 4*32))
		out, err := srv.Forward(ctx, uid, []*gpuhost.Tensor{x})
		if err != nil {
			t.Fatal(err)
		}
		dev.Release(out...)
		if _, err := srv.Backward(ctx, uid, []*gpuhost.Tensor{x}, []*gpuhost.Tensor{rows2(t, dev, 4, 32, make([]float32, 4*32))}); err != nil {
			t.Fatal(err)
		}
		if _, err := api.Undeploy(ctx, alice, uid); err != nil {
			t.Fatal(err)
		}
		if err := api.Delete(ctx, alice, mod.Digest); err != nil {
			t.Fatal(err)
		}
	}
	// Warm up: the first cycles fill the compilation cache and the pools.
	for i := range 10 {
		cycle(i)
	}
	heap0, rss0, g0 := settle()
	for i := 10; i < 210; i++ {
		cycle(i)
	}
	heap1, rss1, g1 := settle()
	t.Logf("heap %d → %d bytes, RSS %d → %d bytes, goroutines %d → %d", heap0, heap1, rss0, rss1, g0, g1)
	if float64(heap1) > 1.1*float64(heap0) {
		t.Errorf("heap grew from %d to %d bytes over 200 cycles", heap0, heap1)
	}
	if float64(rss1) > 1.1*float64(rss0) && !racebuild.Enabled { // the detector's shadow memory is never returned
		t.Errorf("RSS grew from %d to %d bytes over 200 cycles", rss0, rss1)
	}
	if g1 > g0 {
		t.Errorf("goroutines grew from %d to %d", g0, g1)
	}
	families, err := srv.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "expert" && strings.HasPrefix(l.GetValue(), "alice.") {
					t.Fatalf("%s still has a series for %s", f.GetName(), l.GetValue())
				}
			}
		}
	}
	if st := srv.experts.LoaderStats(); st.Compiled != 0 || st.Runtimes != 1 {
		n, r := st.Compiled, st.Runtimes
		t.Errorf("%d compiled modules and %d runtimes left, want none and alice's one", n, r)
	}
	if list, _ := api.List(ctx, alice); len(list) != 0 {
		t.Errorf("alice still has modules: %v", list)
	}
}

// settle collects garbage until the heap stops shrinking and returns the
// live heap, the RSS and the goroutine count.
func settle() (heap, rss uint64, goroutines int) {
	var ms runtime.MemStats
	for range 5 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	debug.FreeOSMemory() // RSS then counts what is live, not what the runtime keeps for later
	runtime.ReadMemStats(&ms)
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			rss = pages * uint64(os.Getpagesize())
		}
	}
	return ms.HeapAlloc, rss, runtime.NumGoroutine()
}
