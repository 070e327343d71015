package host

import (
	"time"

	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/ui"
)

// The dashboard's load history: one sample a second for 15 minutes, in a
// ring of 900 samples (about 25 KB) made once per server.
const (
	historyLen      = 900
	historyInterval = time.Second
)

// loadSampler turns the pools' running totals into one ui.Sample a tick.
// Only the sampler's goroutine uses it.
type loadSampler struct {
	hist   *ui.History
	prev   experts.PoolTotals // summed over every pool at prevAt
	prevAt time.Time
}

// sample adds the load since the previous call, sum being every pool's
// totals now, to the history (the first call only sets the baseline). It
// allocates nothing.
func (l *loadSampler) sample(now time.Time, sum experts.PoolTotals) {
	prev, prevAt := l.prev, l.prevAt
	l.prev, l.prevAt = sum, now
	dt := now.Sub(prevAt).Seconds()
	if prevAt.IsZero() || dt <= 0 {
		return
	}
	batches, samples, run := sum.Batches-prev.Batches, sum.Samples-prev.Samples, sum.Run-prev.Run
	if batches < 0 || samples < 0 || run < 0 {
		// An expert was undeployed and took its totals with it: the
		// interval's load is unknown, and counts as none.
		batches, samples, run = 0, 0, 0
	}
	s := ui.Sample{
		UnixMs:         now.UnixMilli(),
		RowsPerSecond:  float32(float64(samples) / dt),
		QueueDepth:     float32(sum.Depth),
		QueueWaitMaxMs: float32(ms(sum.WaitMax)),
	}
	if batches > 0 {
		s.MeanBatch = float32(float64(samples) / float64(batches))
		s.RunMeanMs = float32(ms(run) / float64(batches))
	}
	l.hist.Add(s)
}

// startHistory starts sampling the load into s.history every
// historyInterval, until stopHistory.
func (s *Server) startHistory() {
	stop, done := make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	s.sampler = stopper{stop: stop, done: done}
	s.mu.Unlock()
	go func() {
		defer close(done)
		l := &loadSampler{hist: s.history}
		t := time.NewTicker(historyInterval)
		defer t.Stop()
		l.sample(time.Now(), s.experts.LoadTotals())
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				l.sample(now, s.experts.LoadTotals())
			}
		}
	}()
}

// stopHistory stops the sampler, if it runs, and waits for it.
func (s *Server) stopHistory() {
	s.mu.Lock()
	stop, done := s.sampler.stop, s.sampler.done
	s.sampler.stop = nil
	s.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
