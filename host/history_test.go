package host

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/ui"
)

// TestLoadSampler: a tick's sample is the load of the experts since the
// previous tick (rates over the interval, the mean batch and run time of
// its batches, the longest wait in it, the queues now), from each
// expert's running totals; each expert's rows in the tick go to its rate,
// and the sample's rows are their sum. An expert deployed since the last
// tick counts all its load, one undeployed drops out, and sampling
// allocates nothing.
func TestLoadSampler(t *testing.T) {
	hist := ui.NewHistory(8, 4, time.Second)
	l := newLoadSampler(hist)
	all := testServer.experts.All()
	a, b := all[0], all[1]
	t0 := time.Unix(1000, 0)
	// One batch of a's before the baseline.
	l.sample(t0, []experts.ExpertTotals{{Expert: a, PoolTotals: experts.PoolTotals{Batches: 1, Samples: 100, Run: time.Millisecond, WaitMax: time.Millisecond}}})
	if got := hist.Since(0, nil); len(got) != 0 {
		t.Fatalf("the baseline tick added %v", got)
	}

	// In the next 2 s: a runs 3 batches of 10+20+30 rows, run 4+6+8 ms,
	// waits up to 7 ms, 2 requests queued; b, deployed meanwhile, one of
	// 40 rows in 2 ms.
	l.sample(t0.Add(2*time.Second), []experts.ExpertTotals{
		{Expert: a, PoolTotals: experts.PoolTotals{Batches: 4, Samples: 160, Run: 19 * time.Millisecond, Depth: 2, WaitMax: 7 * time.Millisecond}},
		{Expert: b, PoolTotals: experts.PoolTotals{Batches: 1, Samples: 40, Run: 2 * time.Millisecond}},
	})
	wantRates := []ui.ExpertRows{{UID: a.UID(), RowsPerSecond: 30}, {UID: b.UID(), RowsPerSecond: 20}}
	if got := hist.Rates(nil); !slices.Equal(got, wantRates) {
		t.Errorf("rates %+v, want %+v", got, wantRates)
	}
	// Then a quiet second, b undeployed.
	l.sample(t0.Add(3*time.Second), []experts.ExpertTotals{
		{Expert: a, PoolTotals: experts.PoolTotals{Batches: 4, Samples: 160, Run: 19 * time.Millisecond, Depth: 2}},
	})
	wantRates = []ui.ExpertRows{{UID: a.UID(), RowsPerSecond: 15}}
	if got := hist.Rates(nil); !slices.Equal(got, wantRates) {
		t.Errorf("rates after b left %+v, want %+v", got, wantRates)
	}
	// b deployed again: its new totals are all new.
	l.sample(t0.Add(4*time.Second), []experts.ExpertTotals{
		{Expert: a, PoolTotals: experts.PoolTotals{Batches: 4, Samples: 160, Run: 19 * time.Millisecond}},
		{Expert: b, PoolTotals: experts.PoolTotals{Batches: 1, Samples: 5, Run: time.Millisecond}},
	})

	got := hist.Since(0, nil)
	want := []ui.Sample{
		{UnixMs: 1002000, RowsPerSecond: 50, MeanBatch: 25, QueueDepth: 2, QueueWaitMaxMs: 7, RunMeanMs: 5},
		{UnixMs: 1003000, QueueDepth: 2},
		{UnixMs: 1004000, RowsPerSecond: 5, MeanBatch: 5, RunMeanMs: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("samples %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sample %d = %+v, want %+v", i, got[i], want[i])
		}
	}

	l = newLoadSampler(hist)
	now := t0.Add(5 * time.Second)
	l.tick(now, testServer) // sees every expert once
	if n := testing.AllocsPerRun(100, func() {
		now = now.Add(time.Second)
		l.tick(now, testServer)
	}); n != 0 {
		t.Errorf("a tick allocates %v times", n)
	}
}

// TestHistoryHoldsTheLongestWindow: the server's history holds the
// dashboard's longest chart window, 15 minutes.
func TestHistoryHoldsTheLongestWindow(t *testing.T) {
	if got := time.Duration(testServer.history.Cap()) * testServer.history.Interval(); got < 15*time.Minute {
		t.Errorf("the history holds %v, want 15 minutes", got)
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
