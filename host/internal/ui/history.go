package ui

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Sample is the server's load over one sampling interval, summed over its
// experts' forward and backward pools: what the dashboard's charts draw.
type Sample struct {
	// UnixMs is when the interval ended.
	UnixMs int64
	// RowsPerSecond is the rows run in batches per second: the sum of the
	// experts' (see History.Add).
	RowsPerSecond float32
	// MeanBatch is the mean rows per batch; 0 when no batch ran.
	MeanBatch float32
	// QueueDepth is the pending requests at the interval's end.
	QueueDepth float32
	// QueueWaitMaxMs is the longest wait in a queue of a request that left
	// it during the interval.
	QueueWaitMaxMs float32
	// RunMeanMs is the mean time a batch ran.
	RunMeanMs float32
}

// ExpertRows is one expert's rows run per second, over one sampling
// interval (History.Add) or the rate window (History.Rates).
type ExpertRows struct {
	UID           string
	RowsPerSecond float32
}

// History keeps the last samples in a ring sized once, at NewHistory, so
// that adding one allocates nothing and the memory it holds never grows;
// and beside it, a ring per expert of its last few intervals' rows, the
// rate window, from which the experts table and its total are drawn.
type History struct {
	interval time.Duration
	rateLen  int // intervals in the rate window

	mu   sync.Mutex
	ring []Sample
	next int // where the next sample goes
	n    int // how many are held, up to len(ring)
	// experts are the rate rings of the experts the last Add carried.
	experts map[string]*rateRing
	adds    uint64 // Adds so far
}

// rateRing is one expert's rows per second over its last intervals.
type rateRing struct {
	vals []float32 // len History.rateLen, made once
	next int
	n    int
	add  uint64 // the Add that carried it last
}

// NewHistory returns a History holding the last capacity samples, taken
// every interval, and each expert's rows over its last rateLen intervals.
func NewHistory(capacity, rateLen int, interval time.Duration) *History {
	if capacity <= 0 || rateLen <= 0 || interval <= 0 {
		panic("BUG: ui: history capacity, rate window and interval must be positive")
	}
	return &History{interval: interval, rateLen: rateLen, ring: make([]Sample, capacity), experts: map[string]*rateRing{}}
}

// Interval is how often a sample is taken.
func (h *History) Interval() time.Duration { return h.interval }

// Cap is how many samples the history holds at most.
func (h *History) Cap() int { return len(h.ring) }

// RateWindow is the span that Rates averages over.
func (h *History) RateWindow() time.Duration { return time.Duration(h.rateLen) * h.interval }

// Add appends s, dropping the oldest sample when the ring is full, and
// each expert's rows over the same interval. s.RowsPerSecond is set to the
// sum of the experts' rows: the server's throughput is its experts', by
// construction, so that the chart and the experts table cannot disagree.
// An expert that experts leaves out is dropped (it was undeployed), so
// that only the experts of the last Add are held. Non-finite values are
// stored as 0. Once every expert has its ring, Add allocates nothing.
func (h *History) Add(s Sample, experts []ExpertRows) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.adds++
	var sum float32
	for _, e := range experts {
		r := h.experts[e.UID]
		if r == nil {
			r = &rateRing{vals: make([]float32, h.rateLen)}
			h.experts[e.UID] = r
		}
		v := finite(e.RowsPerSecond)
		r.vals[r.next] = v
		r.next = (r.next + 1) % len(r.vals)
		r.n = min(r.n+1, len(r.vals))
		r.add = h.adds
		sum += v
	}
	if len(h.experts) > len(experts) {
		for uid, r := range h.experts {
			if r.add != h.adds {
				delete(h.experts, uid)
			}
		}
	}
	s.RowsPerSecond = sum
	for _, v := range []*float32{&s.MeanBatch, &s.QueueDepth, &s.QueueWaitMaxMs, &s.RunMeanMs} {
		*v = finite(*v)
	}
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	h.n = min(h.n+1, len(h.ring))
}

func finite(v float32) float32 {
	if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return v
}

// Since appends to dst the held samples later than unixMs, oldest first,
// and returns it.
func (h *History) Since(unixMs int64, dst []Sample) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	start := (h.next - h.n + len(h.ring)) % len(h.ring)
	for i := range h.n {
		if s := h.ring[(start+i)%len(h.ring)]; s.UnixMs > unixMs {
			dst = append(dst, s)
		}
	}
	return dst
}

// Rates appends to dst each held expert's mean rows per second over the
// rate window (over the intervals it was there for, when fewer), in uid
// order, and returns it.
func (h *History) Rates(dst []ExpertRows) []ExpertRows {
	h.mu.Lock()
	start := len(dst)
	for uid, r := range h.experts {
		var sum float32
		for _, v := range r.vals[:r.n] {
			sum += v
		}
		dst = append(dst, ExpertRows{UID: uid, RowsPerSecond: sum / float32(max(r.n, 1))})
	}
	h.mu.Unlock()
	slices.SortFunc(dst[start:], func(a, b ExpertRows) int { return strings.Compare(a.UID, b.UID) })
	return dst
}
