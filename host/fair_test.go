package host

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/rpc"
)

// TestTenantsShareTheDeviceFairly floods tenant alice's eight experts
// with 32 concurrent clients while tenant bob sends one request at a time
// to his one expert. Batches do not preempt each other, so bob's wait is
// bounded by one of alice's batches: his p99 stays below
// 2 × (his unloaded p99 + alice's mean batch run time). With oldest-first
// scheduling across tenants he would wait for a batch of each of alice's
// busy pools (measured: a p50 of 14-25 ms); without the worker's yield
// after each batch he waited 2-4 ms more for his answer after his batch
// ended (p99 4-8 ms against bounds of 3-4 ms). Both fail it.
func TestTenantsShareTheDeviceFairly(t *testing.T) {
	if os.Getenv("MOEHOST_FAIRNESS") == "" {
		// Its bound is a tail latency: on a 2-core machine that runs the
		// other packages' tests beside it, the OS's scheduling noise is
		// as large as the scheduler's effect. make test-fairness runs it
		// alone.
		t.Skip("a load test: run it alone with make test-fairness")
	}
	ctx := context.Background()
	srv := startTenantsServer(t)
	api := moduleAPI{srv}
	dev := srv.Device()
	const hidden, aliceExperts, clients, bobCalls = 256, 8, 32, 200
	// Alice's batches hold 64 rows at most (four of her requests), so
	// that their run time, which bounds bob's wait, stays near its mean.
	deploy := func(who, experts string, maxRows int) {
		c := rpc.Caller{Tenant: who}
		mod, err := api.Upload(ctx, c, rpc.ModuleUpload{Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := api.Deploy(ctx, c, rpc.Deployment{Experts: experts, Module: mod.Digest,
			Config: map[string]int64{"hidden_dim": hidden}, Batching: rpc.BatchLimits{MaxBatchSize: maxRows},
			Forward: rpc.AccessPublic, Backward: rpc.AccessOwner}); err != nil {
			t.Fatal(err)
		}
	}
	deploy("alice", "alice.ffn.[0:"+strconv.Itoa(aliceExperts)+"]", 64)
	deploy("bob", "bob.ffn.0", 0)
	// Each client makes its input once: the flood should cost the
	// device, not the garbage collector.
	call := func(uid string, x *gpuhost.Tensor) time.Duration {
		start := time.Now()
		out, err := srv.Forward(ctx, uid, []*gpuhost.Tensor{x})
		if err != nil {
			t.Error(err)
			return 0
		}
		d := time.Since(start)
		dev.Release(out...)
		return d
	}
	input := func(rows int) *gpuhost.Tensor { return rows2(t, dev, rows, hidden, make([]float32, rows*hidden)) }
	p99 := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)*99/100]
	}
	bobX := input(4)
	bob := func() []time.Duration {
		ds := make([]time.Duration, bobCalls)
		for i := range ds {
			ds[i] = call("bob.ffn.0", bobX)
		}
		return ds
	}
	for range 10 {
		call("bob.ffn.0", bobX) // warm up
	}

	// A scheduler that does not isolate tenants fails every attempt (bob
	// then waits for a batch of each of alice's busy pools: a p50 of
	// about 30 ms against a bound near 20 ms); a fair one can still lose
	// an attempt's tail to a busy machine, so it gets three.
	var failures []string
	for attempt := range 3 {
		unloaded := p99(bob()) // each attempt's own, as the machine's load drifts
		runs0 := aliceRunTime(t, srv)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range clients {
			x := input(16)
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					call("alice.ffn."+strconv.Itoa(rand.IntN(aliceExperts)), x)
				}
			})
		}
		time.Sleep(200 * time.Millisecond) // let alice's queues fill
		during := bob()
		close(stop)
		wg.Wait()
		loaded := p99(during)
		runs1 := aliceRunTime(t, srv)
		batches := runs1.count - runs0.count
		if batches == 0 {
			t.Fatal("alice ran no batches")
		}
		mean := time.Duration(float64(time.Second) * (runs1.sum - runs0.sum) / float64(batches))
		bound := 2 * (unloaded + mean)
		t.Logf("attempt %d: bob's p99 unloaded %v, under alice's flood %v (p50 %v); alice's mean batch %v over %d batches; bound %v",
			attempt+1, unloaded, loaded, during[len(during)/2], mean, batches, bound)
		bp := srv.expert("bob.ffn.0").Info().GetForwardPool()
		t.Logf("bob's pool: queue wait p50 %.2f ms p99 %.2f ms, run mean %.2f ms", bp.GetQueueWaitP50Ms(), bp.GetQueueWaitP99Ms(), bp.GetRunTimeMeanMs())
		if loaded <= bound {
			return
		}
		failures = append(failures, fmt.Sprintf("%v > 2 × (%v + %v)", loaded, unloaded, mean))
	}
	t.Errorf("bob's p99 under alice's flood broke the bound in every attempt: %s", strings.Join(failures, "; "))
}

// runTotals are the sum (seconds) and count of alice's batch run times.
type runTotals struct {
	sum   float64
	count uint64
}

func aliceRunTime(t *testing.T, srv *Server) runTotals {
	t.Helper()
	families, err := srv.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var r runTotals
	for _, f := range families {
		if f.GetName() != "moehost_batch_run_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if aliceSeries(m) {
				r.sum += m.GetHistogram().GetSampleSum()
				r.count += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return r
}

func aliceSeries(m *dto.Metric) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == "expert" && len(l.GetValue()) > 6 && l.GetValue()[:6] == "alice." {
			return true
		}
	}
	return false
}
