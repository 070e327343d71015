package ui

import (
	"math"
	"sync"
	"time"
)

// Sample is the server's load over one sampling interval, summed over its
// experts' forward and backward pools: what the dashboard's charts draw.
type Sample struct {
	// UnixMs is when the interval ended.
	UnixMs int64
	// RowsPerSecond is the rows run in batches per second.
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

// History keeps the last samples in a ring sized once, at NewHistory, so
// that adding one allocates nothing and the memory it holds never grows.
type History struct {
	interval time.Duration

	mu   sync.Mutex
	ring []Sample
	next int // where the next sample goes
	n    int // how many are held, up to len(ring)
}

// NewHistory returns a History holding the last capacity samples, taken
// every interval.
func NewHistory(capacity int, interval time.Duration) *History {
	if capacity <= 0 || interval <= 0 {
		panic("BUG: ui: history capacity and interval must be positive")
	}
	return &History{interval: interval, ring: make([]Sample, capacity)}
}

// Interval is how often a sample is taken.
func (h *History) Interval() time.Duration { return h.interval }

// Cap is how many samples the history holds at most.
func (h *History) Cap() int { return len(h.ring) }

// Add appends s, dropping the oldest sample when the ring is full.
// Non-finite values are stored as 0.
func (h *History) Add(s Sample) {
	for _, v := range []*float32{&s.RowsPerSecond, &s.MeanBatch, &s.QueueDepth, &s.QueueWaitMaxMs, &s.RunMeanMs} {
		if f := float64(*v); math.IsNaN(f) || math.IsInf(f, 0) {
			*v = 0
		}
	}
	h.mu.Lock()
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	h.n = min(h.n+1, len(h.ring))
	h.mu.Unlock()
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
