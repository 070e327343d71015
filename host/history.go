package host

import (
	"time"

	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/ui"
)

// The dashboard's load history: one sample a second for 15 minutes, in a
// ring of 900 samples (about 25 KB) made once per server, and each
// expert's rows over the last 10 seconds (40 bytes an expert).
const (
	historyLen      = 900
	historyInterval = time.Second
	historyRateLen  = 10
)

// loadSampler turns the experts' running totals into one ui.Sample a
// tick, and each expert's rows in it. Only the sampler's goroutine uses
// it.
type loadSampler struct {
	hist   *ui.History
	prevAt time.Time
	// prev is each expert's totals at prevAt, and the tick that saw it
	// last (an expert that a tick does not see was undeployed).
	prev  map[*experts.Expert]seenTotals
	ticks uint64
	// totals and rows are reused from tick to tick.
	totals []experts.ExpertTotals
	rows   []ui.ExpertRows
}

type seenTotals struct {
	experts.PoolTotals
	tick uint64
}

func newLoadSampler(hist *ui.History) *loadSampler {
	return &loadSampler{hist: hist, prev: map[*experts.Expert]seenTotals{}}
}

// sample adds the load since the previous call to the history, each
// expert's and their sum, totals being every expert's running totals now
// (the first call only sets the baseline). An expert that was not there
// at the previous call was deployed since, and all its load is new. Once
// every expert was seen, it allocates nothing.
func (l *loadSampler) sample(now time.Time, totals []experts.ExpertTotals) {
	prevAt := l.prevAt
	l.prevAt = now
	l.ticks++
	dt := now.Sub(prevAt).Seconds()
	baseline := prevAt.IsZero() || dt <= 0
	var sum experts.PoolTotals
	l.rows = l.rows[:0]
	for _, t := range totals {
		p := l.prev[t.Expert]
		l.prev[t.Expert] = seenTotals{PoolTotals: t.PoolTotals, tick: l.ticks}
		batches, samples, run := t.Batches-p.Batches, t.Samples-p.Samples, t.Run-p.Run
		sum.Batches += batches
		sum.Samples += samples
		sum.Run += run
		sum.Depth += t.Depth
		sum.WaitMax = max(sum.WaitMax, t.WaitMax)
		if !baseline {
			l.rows = append(l.rows, ui.ExpertRows{UID: t.Expert.UID(), RowsPerSecond: float32(float64(samples) / dt)})
		}
	}
	if len(l.prev) > len(totals) {
		for e, p := range l.prev {
			if p.tick != l.ticks {
				delete(l.prev, e)
			}
		}
	}
	if baseline {
		return
	}
	// The throughput is the sum of l.rows, which Add takes.
	s := ui.Sample{
		UnixMs:         now.UnixMilli(),
		QueueDepth:     float32(sum.Depth),
		QueueWaitMaxMs: float32(ms(sum.WaitMax)),
	}
	if sum.Batches > 0 {
		s.MeanBatch = float32(float64(sum.Samples) / float64(sum.Batches))
		s.RunMeanMs = float32(ms(sum.Run) / float64(sum.Batches))
	}
	l.hist.Add(s, l.rows)
}

// tick samples s's experts.
func (l *loadSampler) tick(now time.Time, s *Server) {
	l.totals = s.experts.LoadTotals(l.totals[:0])
	l.sample(now, l.totals)
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
		l := newLoadSampler(s.history)
		t := time.NewTicker(historyInterval)
		defer t.Stop()
		l.tick(time.Now(), s)
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				l.tick(now, s)
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
