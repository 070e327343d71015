package experts

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host/internal/batch"
)

// Recent-window bounds of pool statistics.
const (
	statsWindow   = time.Minute
	statsMaxItems = 4096
)

// Metrics are the server's Prometheus collectors, labelled by expert and
// pool kind ("forward", "backward").
type Metrics struct {
	batches    *prometheus.CounterVec
	failed     *prometheus.CounterVec
	samples    *prometheus.CounterVec
	queueDepth *prometheus.GaugeVec
	batchSize  *prometheus.HistogramVec
	queueWait  *prometheus.HistogramVec
	runTime    *prometheus.HistogramVec
	restarts   *prometheus.CounterVec
	// saves counts checkpoint writes by expert and result (ok, error);
	// lastSave is the Unix time of each expert's last one that wrote.
	saves    *prometheus.CounterVec
	lastSave *prometheus.GaugeVec
}

// NewMetrics makes the experts' series and registers them with reg (nil:
// none, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	labels := []string{"expert", "pool"}
	m := &Metrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Name: "batches_total", Help: "Batches run.",
		}, labels),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Name: "failed_batches_total", Help: "Batches that ended in an error.",
		}, labels),
		samples: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Name: "samples_total", Help: "Rows run in batches.",
		}, labels),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "moehost", Name: "queue_depth", Help: "Pending requests (or pieces of split requests).",
		}, labels),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "moehost", Name: "batch_size", Help: "Rows per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}, labels),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "moehost", Name: "queue_wait_seconds", Help: "Time a request waited in the queue.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		}, labels),
		runTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "moehost", Name: "batch_run_seconds", Help: "Time a batch ran.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		}, labels),
	}
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "moehost", Name: "instance_restarts_total",
		Help: "Wasm instances started to replace one that trapped or ran past its call timeout.",
	}, []string{"expert"})
	m.saves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "moehost", Name: "checkpoint_saves_total",
		Help: "Checkpoint saves that wrote (result ok) or failed (result error); a periodic save of an expert that did not train since writes nothing and is not counted.",
	}, []string{"expert", "result"})
	m.lastSave = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "moehost", Name: "checkpoint_last_save_timestamp_seconds",
		Help: "Unix time of the expert's last checkpoint save that wrote.",
	}, []string{"expert"})
	if reg != nil {
		reg.MustRegister(m.restarts, m.batches, m.failed, m.samples, m.queueDepth, m.batchSize, m.queueWait, m.runTime, m.saves, m.lastSave)
	}
	return m
}

// saved records a checkpoint save of uid that wrote at (err nil) or
// failed.
func (m *Metrics) saved(uid string, at time.Time, err error) {
	if err != nil {
		m.saves.WithLabelValues(uid, "error").Inc()
		return
	}
	m.saves.WithLabelValues(uid, "ok").Inc()
	m.lastSave.WithLabelValues(uid).Set(float64(at.UnixNano()) / 1e9)
}

type batchRecord struct {
	at   time.Time
	rows int
	run  time.Duration
}

type waitRecord struct {
	at   time.Time
	wait time.Duration
}

// poolStats observes one pool: it feeds Prometheus and keeps a recent
// window for Info.
type poolStats struct {
	lim                         batch.Limits
	depth                       prometheus.Gauge
	sizeH, waitH, runH          prometheus.Observer
	batchesC, failedC, samplesC prometheus.Counter

	mu                       sync.Mutex
	batches, failed, samples int64
	queueDepth               int
	runTotal                 time.Duration // of every batch, for the load history
	waitMax                  time.Duration // the longest wait since the last tick
	recent                   []batchRecord
	waits                    []waitRecord
}

func newPoolStats(m *Metrics, uid, kind string, lim batch.Limits) *poolStats {
	l := prometheus.Labels{"expert": uid, "pool": kind}
	return &poolStats{
		lim:      lim,
		depth:    m.queueDepth.With(l),
		sizeH:    m.batchSize.With(l),
		waitH:    m.queueWait.With(l),
		runH:     m.runTime.With(l),
		batchesC: m.batches.With(l),
		failedC:  m.failed.With(l),
		samplesC: m.samples.With(l),
	}
}

// Batch implements batch.Observer.
func (s *poolStats) Batch(rows int, waits []time.Duration, run time.Duration, err error) {
	s.batchesC.Inc()
	s.samplesC.Add(float64(rows))
	s.sizeH.Observe(float64(rows))
	s.runH.Observe(run.Seconds())
	for _, w := range waits {
		s.waitH.Observe(w.Seconds())
	}
	if err != nil {
		s.failedC.Inc()
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches++
	s.samples += int64(rows)
	if err != nil {
		s.failed++
	}
	s.runTotal += run
	s.recent = appendBounded(s.recent, batchRecord{at: now, rows: rows, run: run})
	for _, w := range waits {
		s.waits = appendBounded(s.waits, waitRecord{at: now, wait: w})
		s.waitMax = max(s.waitMax, w)
	}
}

// PoolTotals are a pool's running totals, which the load history
// differences tick by tick.
type PoolTotals struct {
	Batches, Samples int64
	Run              time.Duration
	Depth            int
	WaitMax          time.Duration // since the previous tick
}

// tick returns the pool's totals and resets its longest wait. Only the
// server's load sampler calls it, once a tick.
func (s *poolStats) tick() PoolTotals {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := PoolTotals{Batches: s.batches, Samples: s.samples, Run: s.runTotal, Depth: s.queueDepth, WaitMax: s.waitMax}
	s.waitMax = 0
	return t
}

// Queue implements batch.Observer.
func (s *poolStats) Queue(depth int) {
	s.depth.Set(float64(depth))
	s.mu.Lock()
	s.queueDepth = depth
	s.mu.Unlock()
}

func appendBounded[T any](s []T, v T) []T {
	if len(s) >= statsMaxItems {
		s = append(s[:0], s[len(s)-statsMaxItems/2:]...)
	}
	return append(s, v)
}

// snapshot summarises the pool for Info.
func (s *poolStats) snapshot() *moehostv1.PoolStats {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &moehostv1.PoolStats{
		MaxBatchSize:  int64(s.lim.MaxBatchSize),
		MinBatchSize:  int64(s.lim.MinBatchSize),
		MaxWaitMs:     ms(s.lim.MaxWait),
		QueueSize:     int64(s.lim.QueueSize),
		QueueDepth:    int64(s.queueDepth),
		Batches:       s.batches,
		FailedBatches: s.failed,
		Samples:       s.samples,
	}
	var n, rows int
	var run time.Duration
	var start time.Time // when the first batch in the window started
	for _, b := range s.recent {
		if now.Sub(b.at) > statsWindow {
			continue
		}
		if n == 0 {
			start = b.at.Add(-b.run)
		}
		n++
		rows += b.rows
		run += b.run
	}
	if n > 0 {
		span := max(now.Sub(start), time.Millisecond).Seconds()
		out.BatchesPerSecond = float64(n) / span
		out.SamplesPerSecond = float64(rows) / span
		out.MeanBatchSize = float64(rows) / float64(n)
		out.RunTimeMeanMs = ms(run / time.Duration(n))
	}
	var waits []time.Duration
	for _, w := range s.waits {
		if now.Sub(w.at) <= statsWindow {
			waits = append(waits, w.wait)
		}
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		out.QueueWaitP50Ms = ms(waits[(len(waits)-1)*50/100])
		out.QueueWaitP99Ms = ms(waits[(len(waits)-1)*99/100])
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var _ batch.Observer = (*poolStats)(nil)

// healthDesc describes moehost_expert_healthy.
var healthDesc = prometheus.NewDesc("moehost_expert_healthy",
	"1 while the expert is healthy, 0 after UnhealthyAfter failed batches in a row until one succeeds (as Info's healthy).",
	[]string{"expert"}, nil)

// HealthCollector returns a collector of moehost_expert_healthy over r's
// experts, read at each scrape: an expert that is undeployed leaves no
// series behind.
func (r *Registry) HealthCollector() prometheus.Collector { return healthCollector{r} }

type healthCollector struct{ r *Registry }

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- healthDesc }

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.r.All() {
		v := 0.0
		if e.stats.healthy() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(healthDesc, prometheus.GaugeValue, v, e.uid)
	}
}
