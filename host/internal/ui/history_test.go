package ui

import (
	"encoding/json"
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
	h := NewHistory(3, time.Second)
	if got := h.Since(0, nil); len(got) != 0 {
		t.Fatalf("empty history: %v", got)
	}
	for i := int64(1); i <= 5; i++ {
		h.Add(Sample{UnixMs: i * 1000, RowsPerSecond: float32(i)})
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
	h.Add(Sample{UnixMs: 6000, MeanBatch: float32(math.NaN()), RunMeanMs: float32(math.Inf(1))})
	last := h.Since(5000, nil)
	if len(last) != 1 || last[0].MeanBatch != 0 || last[0].RunMeanMs != 0 {
		t.Errorf("non-finite values kept: %+v", last)
	}
}

// TestHistoryAddAllocates nothing: the ring is sized up front.
func TestHistoryAddAllocates(t *testing.T) {
	h := NewHistory(900, time.Second)
	var i int64
	if n := testing.AllocsPerRun(2000, func() {
		i++
		h.Add(Sample{UnixMs: i, RowsPerSecond: 1})
	}); n != 0 {
		t.Errorf("Add allocates %v times", n)
	}
}

// TestHistoryEndpoint: /ui/api/history serves the ring column by column,
// ?since= limits it, and a bad since is a 400 that says what to send.
func TestHistoryEndpoint(t *testing.T) {
	h := NewHistory(900, time.Second)
	for i := int64(1); i <= 4; i++ {
		h.Add(Sample{UnixMs: i * 1000, RowsPerSecond: float32(10 * i), MeanBatch: 2, QueueDepth: 1, QueueWaitMaxMs: 0.5, RunMeanMs: 3})
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
