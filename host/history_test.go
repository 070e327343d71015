package host

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/ui"
)

// TestLoadSampler: a tick's sample is the load of the pools since the
// previous tick (rates over the interval, the mean batch and run time of
// its batches, the longest wait in it, the queues now), summed over the
// experts, and sampling allocates nothing.
func TestLoadSampler(t *testing.T) {
	m := newMetrics()
	mk := func(uid string) *expert {
		return &expert{uid: uid, pools: pools{fwdStats: newPoolStats(m, uid, "forward", batch.Limits{}), bwdStats: newPoolStats(m, uid, "backward", batch.Limits{})}}
	}
	a, b := mk("a.0"), mk("b.0")
	experts := []rpc.Expert{a, b}
	hist := ui.NewHistory(8, time.Second)
	l := &loadSampler{hist: hist}
	t0 := time.Unix(1000, 0)
	a.pools.fwdStats.Batch(100, []time.Duration{time.Millisecond}, time.Millisecond, nil) // before the baseline
	l.sample(t0, experts)
	if got := hist.Since(0, nil); len(got) != 0 {
		t.Fatalf("the baseline tick added %v", got)
	}

	// In the next 2 s: 3 batches of 10+20+30 rows over two experts and
	// both pools, waits up to 7 ms, 2 requests queued.
	a.pools.fwdStats.Batch(10, []time.Duration{2 * time.Millisecond, 7 * time.Millisecond}, 4*time.Millisecond, nil)
	a.pools.bwdStats.Batch(20, []time.Duration{3 * time.Millisecond}, 6*time.Millisecond, nil)
	b.pools.fwdStats.Batch(30, nil, 8*time.Millisecond, nil)
	b.pools.fwdStats.Queue(2)
	l.sample(t0.Add(2*time.Second), experts)
	// Then a quiet second.
	l.sample(t0.Add(3*time.Second), experts)

	got := hist.Since(0, nil)
	want := []ui.Sample{
		{UnixMs: 1002000, RowsPerSecond: 30, MeanBatch: 20, QueueDepth: 2, QueueWaitMaxMs: 7, RunMeanMs: 6},
		{UnixMs: 1003000, QueueDepth: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("samples %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sample %d = %+v, want %+v", i, got[i], want[i])
		}
	}

	// An undeployed expert takes its totals along: no negative rates.
	l.sample(t0.Add(4*time.Second), experts[1:])
	if s := hist.Since(1003000, nil); len(s) != 1 || s[0].RowsPerSecond != 0 || s[0].MeanBatch != 0 {
		t.Errorf("after an undeploy: %+v", s)
	}

	now := t0.Add(5 * time.Second)
	if n := testing.AllocsPerRun(100, func() {
		now = now.Add(time.Second)
		l.sample(now, experts)
	}); n != 0 {
		t.Errorf("a tick allocates %v times", n)
	}
}

// TestHistoryServed: a started server samples its load every second and
// serves it at /ui/api/history, so that the dashboard draws it at once.
func TestHistoryServed(t *testing.T) {
	var v struct {
		IntervalMs int64     `json:"interval_ms"`
		Capacity   int       `json:"capacity"`
		UnixMs     []int64   `json:"unix_ms"`
		Rows       []float32 `json:"rows_per_second"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(v.UnixMs) < 2 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		res, err := http.Get("http://" + testServer.Addr() + "/ui/api/history")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(res.Body).Decode(&v)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET /ui/api/history: %s, %v", res.Status, err)
		}
	}
	if len(v.UnixMs) < 2 || len(v.Rows) != len(v.UnixMs) || v.IntervalMs != 1000 || v.Capacity != historyLen {
		t.Fatalf("history %+v", v)
	}
	if d := v.UnixMs[1] - v.UnixMs[0]; d < 500 || d > 1500 {
		t.Errorf("samples %d ms apart, want about 1000", d)
	}
}
