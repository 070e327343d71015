package host

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moehost/moehost/gpuhost"
)

// DefaultMemoryFraction is the share of the memory available to the
// process (the smaller of the cgroup's memory.max and the machine's
// MemTotal) that the memory limit takes when none is set.
const DefaultMemoryFraction = 0.75

// DefaultMemoryLimit returns DefaultMemoryFraction of the memory available
// to the process, or 0 (no limit) where neither the cgroup nor
// /proc/meminfo says how much that is.
func DefaultMemoryLimit() int64 {
	avail := availableMemory()
	if avail <= 0 {
		return 0
	}
	return int64(float64(avail) * DefaultMemoryFraction)
}

// availableMemory returns the smaller of the cgroup's memory limit (v2
// memory.max or v1 memory.limit_in_bytes) and MemTotal, or 0 if neither
// is known.
func availableMemory() int64 {
	var total int64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// MemTotal:       24684184 kB
			fields := strings.Fields(sc.Text())
			if len(fields) == 3 && fields[0] == "MemTotal:" && fields[2] == "kB" {
				if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil && kb > 0 && kb < math.MaxInt64/1024 {
					total = kb * 1024
				}
			}
		}
		f.Close()
	}
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// "max" (v2) or a huge number (v1) mean no limit.
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (total == 0 || n < total) {
			total = n
		}
		break
	}
	return total
}

// ParseMemoryLimit parses a memory limit as `moehost serve --memory-limit`
// takes it: a byte count with an optional unit (B, KB, MB, GB, TB in
// powers of 1000; KiB, MiB, GiB, TiB in powers of 1024), a percentage of
// the memory available to the process ("75%"), or "none" (no limit,
// returned as -1, for WithMemoryLimit).
func ParseMemoryLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "none") {
		return -1, nil
	}
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if err != nil || !(p > 0 && p <= 100) {
			return 0, fmt.Errorf("memory limit %q: want a percentage in (0, 100]", s)
		}
		avail := availableMemory()
		if avail <= 0 {
			return 0, fmt.Errorf("memory limit %q: the memory available to the process is unknown; give bytes", s)
		}
		return int64(float64(avail) * p / 100), nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	num, mult := s, 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || !(v > 0) || v*mult >= math.MaxInt64 {
		return 0, fmt.Errorf("memory limit %q: want a positive size such as 2GiB or 1500MB, a percentage, or none", s)
	}
	return int64(v * mult), nil
}

// DeviceMemory is the tensor memory of one device.
type DeviceMemory struct {
	// Device names the device ("cpu").
	Device string
	gpuhost.MemStats
}

// MemoryStats returns the tensor memory of each device the server runs
// experts on: live, peak and pooled bytes and the pool's hits. It is
// empty before Start.
func (s *Server) MemoryStats() []DeviceMemory {
	devs := s.experts.Devices()
	out := make([]DeviceMemory, len(devs))
	for i, d := range devs {
		out[i] = DeviceMemory{Device: d.Name(), MemStats: d.MemStats()}
	}
	return out
}

// MemoryLimit returns the limit the server runs under, in bytes: the
// Go runtime's soft limit and the ceiling on live tensor bytes. 0 means
// none.
func (s *Server) MemoryLimit() int64 { return s.cfg.memoryLimitBytes() }

// newDevices opens the server's devices (WithDevice) under its memory
// limit, sets the Go runtime's soft limit to the same number, and exports
// the devices' memory to /metrics.
func (s *Server) newDevices() ([]gpuhost.Device, error) {
	limit := s.cfg.memoryLimitBytes()
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	devs, err := s.openDevices(limit)
	if err != nil {
		return nil, err
	}
	if err := s.prom.Register(newMemCollector(s.MemoryStats)); err != nil {
		return nil, errors.Join(fmt.Errorf("registering memory metrics: %w", err), closeDevices(devs))
	}
	s.log.Info("memory limit", "bytes", limit)
	return devs, nil
}

// freeOSMemory is the CPU device's idle function (gpuhost.WithOnIdle):
// once its pool has given its storage back, what the Go runtime holds free
// goes back too (debug.FreeOSMemory: a collection, then every free page
// returned). Otherwise the request path's garbage and the heap's free
// spans stayed in RSS: an idle server allocates nothing, so no collection
// comes, and the scavenger keeps what is under the heap goal (about 100 MB
// of a 4-ffn server, issue 39). It costs a collection of a heap that is
// mostly tensors, which hold no pointers, once per idle spell; one runs at
// a time. Servers that leave the runtime alone (WithMemoryLimit < 0) do
// not install it.
func freeOSMemory() {
	if freeing.CompareAndSwap(false, true) {
		defer freeing.Store(false)
		debug.FreeOSMemory()
	}
}

var freeing atomic.Bool

// kernelThreads returns the threads the CPU device's kernels use: as many
// as GOMAXPROCS was when the first server started. That first call also
// raises GOMAXPROCS by one, process-wide, so that the goroutines that
// answer requests always find a P: kernels never block, and Go preempts a
// running goroutine only every 10 ms, so with every P in a kernel a
// finished request waited up to that long to be sent (a tenant's p99 under
// another's flood was 4-5 batches instead of one; make test-fairness).
func kernelThreads() int {
	kernelThreadsOnce.Do(func() {
		kernelThreadsN = runtime.GOMAXPROCS(0)
		runtime.GOMAXPROCS(kernelThreadsN + 1)
	})
	return kernelThreadsN
}

var (
	kernelThreadsOnce sync.Once
	kernelThreadsN    int
)

// memoryLimitBytes resolves the WithMemoryLimit setting.
func (c *config) memoryLimitBytes() int64 {
	switch {
	case c.memoryLimit < 0:
		return 0
	case c.memoryLimit == 0:
		return DefaultMemoryLimit()
	}
	return c.memoryLimit
}

// memCollector exports the devices' MemStats to Prometheus at scrape
// time.
type memCollector struct {
	devices                   func() []DeviceMemory
	live, peak, pool, hitRate *prometheus.Desc
	hits, misses, refused     *prometheus.Desc
	notAdmitted               *prometheus.Desc
	limit, granted, requested *prometheus.Desc
	dropped                   *prometheus.Desc
}

func newMemCollector(devices func() []DeviceMemory) *memCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("moehost_device_"+name, help, []string{"device"}, nil)
	}
	return &memCollector{
		devices:     devices,
		live:        d("live_tensor_bytes", "Bytes held by live tensors (at their size class) and reservations."),
		peak:        d("peak_tensor_bytes", "Recent high-water mark of live tensor bytes; it bounds live plus pool bytes."),
		pool:        d("pool_bytes", "Released tensor storage kept for reuse."),
		hitRate:     d("pool_hit_rate", "Share of float32 allocations served from the pool."),
		hits:        d("pool_hits_total", "Float32 allocations served from the pool."),
		misses:      d("pool_misses_total", "Float32 allocations served from fresh memory."),
		refused:     d("refused_allocations_total", "Allocations refused because they would pass the memory limit."),
		notAdmitted: d("refused_admissions_total", "Requests refused at the door because their tensors would leave too little of the memory limit."),
		limit:       d("memory_limit_bytes", "Ceiling on live tensor bytes (shared by all devices; 0: none)."),
		granted:     d("granted_bytes_total", "Float32 storage given by allocations, at size class (or larger pooled buffer) size."),
		requested:   d("requested_bytes_total", "Float32 storage asked for by allocations; granted/requested - 1 is the waste of size classes."),
		dropped:     d("pool_dropped_bytes_total", "Released tensor storage the pool let go of to stay under its bound (on the CPU, given back to the operating system at once when 64 KiB or more)."),
	}
}

func (c *memCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.live, c.peak, c.pool, c.hitRate, c.hits, c.misses, c.refused, c.notAdmitted, c.limit, c.granted, c.requested, c.dropped} {
		ch <- d
	}
}

func (c *memCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.devices() {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, m.Device)
		}
		n := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), m.Device)
		}
		g(c.live, float64(m.LiveBytes))
		g(c.peak, float64(m.PeakBytes))
		g(c.pool, float64(m.PoolBytes))
		g(c.hitRate, m.HitRate())
		g(c.limit, float64(m.Limit))
		n(c.hits, m.PoolHits)
		n(c.misses, m.PoolMisses)
		n(c.refused, m.Refused)
		n(c.notAdmitted, m.NotAdmitted)
		n(c.granted, m.GrantedBytes)
		n(c.requested, m.RequestedBytes)
		n(c.dropped, m.DroppedBytes)
	}
}

var _ prometheus.Collector = (*memCollector)(nil)
