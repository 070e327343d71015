package experts

import (
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/batch"
)

// TestLoadTotals: the registry sums every pool's running totals, takes
// the longest wait of any since the last tick and restarts it, and
// allocates nothing.
func TestLoadTotals(t *testing.T) {
	m := NewMetrics(nil)
	mk := func(uid string) *Expert {
		return &Expert{uid: uid, pools: pools{fwdStats: newPoolStats(m, uid, "forward", batch.Limits{}), bwdStats: newPoolStats(m, uid, "backward", batch.Limits{})}}
	}
	r := New(Config{})
	a, b := mk("a.0"), mk("b.0")
	r.put(a)
	r.put(b)
	a.pools.fwdStats.Batch(10, []time.Duration{2 * time.Millisecond, 7 * time.Millisecond}, 4*time.Millisecond, nil)
	a.pools.bwdStats.Batch(20, []time.Duration{3 * time.Millisecond}, 6*time.Millisecond, nil)
	b.pools.fwdStats.Batch(30, nil, 8*time.Millisecond, nil)
	b.pools.fwdStats.Queue(2)
	want := PoolTotals{Batches: 3, Samples: 60, Run: 18 * time.Millisecond, Depth: 2, WaitMax: 7 * time.Millisecond}
	if got := r.LoadTotals(); got != want {
		t.Errorf("totals %+v, want %+v", got, want)
	}
	want.WaitMax = 0
	if got := r.LoadTotals(); got != want {
		t.Errorf("the next tick's totals %+v, want %+v (the longest wait restarts)", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { r.LoadTotals() }); n != 0 {
		t.Errorf("LoadTotals allocates %v times", n)
	}
}
