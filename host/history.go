package host

import (
	"time"

	"github.com/moehost/moehost/host/internal/rpc"
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
	prev   poolTotals // summed over every pool at prevAt
	prevAt time.Time
}

// sample adds the load since the previous call to the history (the first
// call only sets the baseline). It allocates nothing.
func (l *loadSampler) sample(now time.Time, experts []rpc.Expert) {
	var sum poolTotals
	for _, re := range experts {
		e, ok := re.(*expert)
		if !ok {
			continue
		}
		for _, p := range [...]*poolStats{e.pools.fwdStats, e.pools.bwdStats} {
			if p == nil {
				continue
			}
			t := p.tick()
			sum.batches += t.batches
			sum.samples += t.samples
			sum.run += t.run
			sum.depth += t.depth
			sum.waitMax = max(sum.waitMax, t.waitMax)
		}
	}
	prev, prevAt := l.prev, l.prevAt
	l.prev, l.prevAt = sum, now
	dt := now.Sub(prevAt).Seconds()
	if prevAt.IsZero() || dt <= 0 {
		return
	}
	batches, samples, run := sum.batches-prev.batches, sum.samples-prev.samples, sum.run-prev.run
	if batches < 0 || samples < 0 || run < 0 {
		// An expert was undeployed and took its totals with it: the
		// interval's load is unknown, and counts as none.
		batches, samples, run = 0, 0, 0
	}
	s := ui.Sample{
		UnixMs:         now.UnixMilli(),
		RowsPerSecond:  float32(float64(samples) / dt),
		QueueDepth:     float32(sum.depth),
		QueueWaitMaxMs: float32(ms(sum.waitMax)),
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
	s.stopHist, s.histDone = stop, done
	s.mu.Unlock()
	go func() {
		defer close(done)
		l := &loadSampler{hist: s.history}
		t := time.NewTicker(historyInterval)
		defer t.Stop()
		l.sample(time.Now(), s.sortedExperts())
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				l.sample(now, s.sortedExperts())
			}
		}
	}()
}

// stopHistory stops the sampler, if it runs, and waits for it.
func (s *Server) stopHistory() {
	s.mu.Lock()
	stop, done := s.stopHist, s.histDone
	s.stopHist = nil
	s.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
}

// sortedExperts returns the experts in uid order. The slice is replaced,
// never changed, when an expert is deployed or undeployed, so that the
// caller may read it without the lock.
func (s *Server) sortedExperts() []rpc.Expert {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sorted
}
