package ui

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func unixMs(s []Sample) []int64 {
	out := make([]int64, len(s))
	for i, x := range s {
		out[i] = x.UnixMs
	}
	return out
}

// TestHistoryRing: the ring keeps the newest samples in order, Since
// skips the ones already seen, and non-finite values become 0.
func TestHistoryRing(t *testing.T) {
	h := NewHistory(3, 2, time.Second)
	if got := h.Since(0, nil); len(got) != 0 {
		t.Fatalf("empty history: %v", got)
	}
	for i := int64(1); i <= 5; i++ {
		h.Add(Sample{UnixMs: i * 1000}, []ExpertRows{{"a.0", float32(i)}})
	}
	cases := []struct {
		since int64
		want  []int64
	}{
		{0, []int64{3000, 4000, 5000}},
		{3000, []int64{4000, 5000}},
		{3500, []int64{4000, 5000}},
		{5000, []int64{}},
	}
	for _, c := range cases {
		if got := unixMs(h.Since(c.since, nil)); !slices.Equal(got, c.want) {
			t.Errorf("Since(%d) = %v, want %v", c.since, got, c.want)
		}
	}
	h.Add(Sample{UnixMs: 6000, MeanBatch: float32(math.NaN()), RunMeanMs: float32(math.Inf(1))}, []ExpertRows{{"a.0", float32(math.NaN())}})
	last := h.Since(5000, nil)
	if len(last) != 1 || last[0].MeanBatch != 0 || last[0].RunMeanMs != 0 || last[0].RowsPerSecond != 0 {
		t.Errorf("non-finite values kept: %+v", last)
	}
	if r := h.Rates(nil); len(r) != 1 || r[0].RowsPerSecond != 2.5 {
		t.Errorf("rates %+v, want a.0's (5+0)/2", r)
	}
}

// TestHistoryThroughputIsTheExperts: each sample's rows per second is
// the sum of its experts', whatever the caller put in it, and the mean of
// the samples over the rate window is the sum of the experts' rates over
// it (issue 10: the headline and the experts table read the same ticks).
// An expert that joins late is averaged over the ticks it was there for;
// one that a tick leaves out is gone.
func TestHistoryThroughputIsTheExperts(t *testing.T) {
	h := NewHistory(16, 4, time.Second)
	ticks := [][]ExpertRows{
		{{"a.0", 100}, {"b.0", 10}},
		{{"a.0", 200}, {"b.0", 20}},
		{{"a.0", 300}, {"b.0", 30}},
		{{"a.0", 400}, {"b.0", 40}},
		{{"a.0", 500}, {"b.0", 50}},
	}
	for i, rows := range ticks {
		h.Add(Sample{UnixMs: int64(i+1) * 1000, RowsPerSecond: 12345}, rows)
	}
	samples := h.Since(0, nil)
	for i, s := range samples {
		if want := ticks[i][0].RowsPerSecond + ticks[i][1].RowsPerSecond; s.RowsPerSecond != want {
			t.Errorf("sample %d: %v rows/s, want the experts' sum %v", i, s.RowsPerSecond, want)
		}
	}
	want := []ExpertRows{{"a.0", (200 + 300 + 400 + 500) / 4.0}, {"b.0", (20 + 30 + 40 + 50) / 4.0}}
	got := h.Rates(nil)
	if !slices.Equal(got, want) {
		t.Fatalf("rates %+v, want %+v", got, want)
	}
	var mean float32
	for _, s := range samples[1:] {
		mean += s.RowsPerSecond / 4
	}
	if sum := got[0].RowsPerSecond + got[1].RowsPerSecond; mean != sum {
		t.Errorf("mean throughput over the window %v, want the rates' sum %v", mean, sum)
	}

	h.Add(Sample{UnixMs: 6000}, []ExpertRows{{"b.0", 60}, {"c.0", 7}})
	h.Add(Sample{UnixMs: 7000}, []ExpertRows{{"b.0", 70}, {"c.0", 9}})
	want = []ExpertRows{{"b.0", (40 + 50 + 60 + 70) / 4.0}, {"c.0", 8}}
	if got := h.Rates(nil); !slices.Equal(got, want) {
		t.Errorf("after a.0 left and c.0 came: %+v, want %+v", got, want)
	}
}

// TestHistoryBound: however long it runs and however many experts come
// and go, the history holds its capacity of samples (the newest, in
// order), each expert at most its rate window, and only the experts of
// the last tick. A ring of 900 at a second holds the dashboard's longest
// chart window, 15 minutes.
func TestHistoryBound(t *testing.T) {
	const capacity, rateLen = 900, 10
	h := NewHistory(capacity, rateLen, time.Second)
	ring := &h.ring[0]
	for i := range 3 * capacity {
		uid := fmt.Sprintf("e.%d", i%50) // 50 experts, each for a tick in 50
		h.Add(Sample{UnixMs: int64(i+1) * 1000}, []ExpertRows{{uid, 1}, {"steady.0", 2}})
	}
	got := h.Since(0, nil)
	if len(got) != capacity || got[0].UnixMs != 2*capacity*1000+1000 || got[len(got)-1].UnixMs != 3*capacity*1000 {
		t.Fatalf("held %d samples, %d … %d ms", len(got), got[0].UnixMs, got[len(got)-1].UnixMs)
	}
	if span := time.Duration(got[len(got)-1].UnixMs-got[0].UnixMs)*time.Millisecond + h.Interval(); span < 15*time.Minute {
		t.Errorf("the history spans %v, want the 15 minutes of the longest chart window", span)
	}
	if &h.ring[0] != ring || len(h.ring) != capacity || cap(h.ring) != capacity {
		t.Errorf("the ring grew or moved: len %d cap %d", len(h.ring), cap(h.ring))
	}
	if len(h.experts) != 2 {
		t.Errorf("%d experts held, want the last tick's 2", len(h.experts))
	}
	for uid, r := range h.experts {
		if len(r.vals) != rateLen || cap(r.vals) != rateLen || r.n > rateLen {
			t.Errorf("%s: ring len %d cap %d n %d, want %d", uid, len(r.vals), cap(r.vals), r.n, rateLen)
		}
	}
	if r := h.Rates(nil); len(r) != 2 || r[1] != (ExpertRows{"steady.0", 2}) {
		t.Errorf("rates %+v", r)
	}
}

// TestHistoryAddAllocates nothing: the ring is sized up front.
func TestHistoryAddAllocates(t *testing.T) {
	h := NewHistory(900, 10, time.Second)
	rows := []ExpertRows{{"a.0", 1}, {"b.0", 2}}
	h.Add(Sample{}, rows)
	var i int64
	if n := testing.AllocsPerRun(2000, func() {
		i++
		h.Add(Sample{UnixMs: i}, rows)
	}); n != 0 {
		t.Errorf("Add allocates %v times", n)
	}
}

// TestHistoryEndpoint: /ui/api/history serves the ring column by column,
// ?since= limits it, and a bad since is a 400 that says what to send.
func TestHistoryEndpoint(t *testing.T) {
	h := NewHistory(900, 10, time.Second)
	for i := int64(1); i <= 4; i++ {
		h.Add(Sample{UnixMs: i * 1000, MeanBatch: 2, QueueDepth: 1, QueueWaitMaxMs: 0.5, RunMeanMs: 3}, []ExpertRows{{"a.0", float32(10 * i)}})
	}
	srv := httptest.NewServer(Handler(API{History: h}))
	defer srv.Close()
	get := func(path string) (*http.Response, historyJSON, string) {
		t.Helper()
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var body strings.Builder
		var v historyJSON
		if _, err := io.Copy(&body, res.Body); err != nil {
			t.Fatal(err)
		}
		if res.StatusCode == http.StatusOK {
			if err := json.Unmarshal([]byte(body.String()), &v); err != nil {
				t.Fatalf("%s: %v\n%s", path, err, body.String())
			}
		}
		return res, v, body.String()
	}
	res, v, _ := get("/ui/api/history")
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if v.IntervalMs != 1000 || v.Capacity != 900 || !slices.Equal(v.UnixMs, []int64{1000, 2000, 3000, 4000}) ||
		!slices.Equal(v.RowsPerSecond, []float32{10, 20, 30, 40}) || v.MeanBatch[3] != 2 || v.QueueDepth[0] != 1 ||
		v.QueueWaitMaxMs[1] != 0.5 || v.RunMeanMs[2] != 3 {
		t.Errorf("history = %+v", v)
	}
	if _, v, _ = get("/ui/api/history?since=2000"); !slices.Equal(v.UnixMs, []int64{3000, 4000}) {
		t.Errorf("since=2000: %v", v.UnixMs)
	}
	if res, _, body := get("/ui/api/history?since=soon"); res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Unix milliseconds") {
		t.Errorf("since=soon: %s %q", res.Status, body)
	}
	if res, _, _ := get("/ui/api/nothing"); res.StatusCode != http.StatusNotFound {
		t.Errorf("/ui/api/nothing: %s", res.Status)
	}
	// Without a history, its path is not found rather than the page.
	srv2 := httptest.NewServer(Handler(API{}))
	defer srv2.Close()
	if res, err := http.Get(srv2.URL + "/ui/api/history"); err != nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("no history: %v %v", res.Status, err)
	}
}
