package experts

import (
	"slices"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/batch"
)

// TestLoadTotals: the registry sums each expert's two pools' running
// totals, in uid order, takes the longest wait of either since the last
// tick and restarts it, and allocates nothing.
func TestLoadTotals(t *testing.T) {
	m := NewMetrics(nil)
	mk := func(uid string) *Expert {
		return &Expert{uid: uid, pools: pools{fwdStats: newPoolStats(m, uid, "forward", batch.Limits{}), bwdStats: newPoolStats(m, uid, "backward", batch.Limits{})}}
	}
	r := New(Config{})
	a, b := mk("a.0"), mk("b.0")
	r.put(b)
	r.put(a)
	a.pools.fwdStats.Batch(10, []time.Duration{2 * time.Millisecond, 7 * time.Millisecond}, 4*time.Millisecond, nil)
	a.pools.bwdStats.Batch(20, []time.Duration{3 * time.Millisecond}, 6*time.Millisecond, nil)
	b.pools.fwdStats.Batch(30, nil, 8*time.Millisecond, nil)
	b.pools.fwdStats.Queue(2)
	want := []ExpertTotals{
		{Expert: a, PoolTotals: PoolTotals{Batches: 2, Samples: 30, Run: 10 * time.Millisecond, WaitMax: 7 * time.Millisecond}},
		{Expert: b, PoolTotals: PoolTotals{Batches: 1, Samples: 30, Run: 8 * time.Millisecond, Depth: 2}},
	}
	if got := r.LoadTotals(nil); !slices.Equal(got, want) {
		t.Errorf("totals %+v, want %+v", got, want)
	}
	want[0].WaitMax = 0
	if got := r.LoadTotals(nil); !slices.Equal(got, want) {
		t.Errorf("the next tick's totals %+v, want %+v (the longest wait restarts)", got, want)
	}
	buf := make([]ExpertTotals, 0, 2)
	if n := testing.AllocsPerRun(100, func() { r.LoadTotals(buf[:0]) }); n != 0 {
		t.Errorf("LoadTotals allocates %v times", n)
	}
}
