package gpuhost

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/internal/pages"
)

// TestSizeClass checks that every class holds its request, wastes less
// than an eighth of itself, and is shared by nearby sizes: a batch of 37
// rows of 1024 floats takes the class of a batch of 40.
func TestSizeClass(t *testing.T) {
	t.Parallel()
	prev := 0
	for n := 1; n <= 1<<20; n++ {
		c := sizeClass(n)
		if c < n || c < prev {
			t.Fatalf("sizeClass(%d) = %d: smaller than the request or than sizeClass(%d) = %d", n, c, n-1, prev)
		}
		if 8*(c-n) >= c && n > 2*classSubSteps {
			t.Fatalf("sizeClass(%d) = %d wastes %d floats, an eighth or more", n, c, c-n)
		}
		if sizeClass(c) != c {
			t.Fatalf("sizeClass(sizeClass(%d)) = %d, want %d", n, sizeClass(c), c)
		}
		prev = c
	}
	tests := []struct {
		name string
		n    int
		want int
	}{
		{"small is exact", 13, 13},
		{"power of two", 1 << 15, 1 << 15},
		{"37 rows of 1024", 37 * 1024, 40 * 1024},
		{"first step above 32 Ki", 32*1024 + 1, 36 * 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sizeClass(tt.n); got != tt.want {
				t.Errorf("sizeClass(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}

// TestPoolTrimsWhenIdle checks the decay: an idle device's pool is empty
// two periods after its last release, and its peak falls back to the
// live bytes.
func TestPoolTrimsWhenIdle(t *testing.T) {
	t.Parallel()
	d := NewCPU(1).(*cpuDevice)
	d.mem.decay = 20 * time.Millisecond
	keep, err := d.Zeros(abi.DTypeFloat32, []int{100})
	if err != nil {
		t.Fatal(err)
	}
	var ts []*Tensor
	for _, n := range []int{1000, 3000, 7000} {
		x, err := d.Zeros(abi.DTypeFloat32, []int{n})
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, x)
	}
	d.Release(ts...)
	if s := d.MemStats(); s.PoolBytes != 4*(1024+3072+7168) {
		t.Fatalf("pool holds %d bytes after the release, want %d", s.PoolBytes, 4*(1024+3072+7168))
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.MemStats().PoolBytes > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	s := d.MemStats()
	if s.PoolBytes != 0 || s.PeakBytes != s.LiveBytes || s.LiveBytes != 4*int64(sizeClass(100)) {
		t.Errorf("idle device: %+v, want an empty pool and peak = live = %d bytes", s, 4*sizeClass(100))
	}
	d.Release(keep)
}

// TestPoolLongTail allocates and releases batches of many distinct sizes
// and checks the invariant at every step: live + pool bytes never pass
// the recent high-water mark of live bytes, so the pool never holds more
// than the largest batch's worth.
func TestPoolLongTail(t *testing.T) {
	t.Parallel()
	d := NewCPU(1).(*cpuDevice)
	rng := rand.New(rand.NewPCG(3, 4))
	var peak int64
	for range 2000 {
		rows := 1 + rng.IntN(500)
		var ts []*Tensor
		for _, w := range []int{64, 256, 64} {
			x, err := d.allocDirty(abi.DTypeFloat32, []int{rows, w})
			if err != nil {
				t.Fatal(err)
			}
			ts = append(ts, x)
		}
		s := d.MemStats()
		peak = max(peak, s.LiveBytes)
		if s.LiveBytes+s.PoolBytes > s.PeakBytes {
			t.Fatalf("live + pool bytes = %d + %d with a batch live, more than the high-water mark %d", s.LiveBytes, s.PoolBytes, s.PeakBytes)
		}
		d.Release(ts...)
		s = d.MemStats()
		if s.LiveBytes != 0 {
			t.Fatalf("live bytes %d after releasing everything", s.LiveBytes)
		}
		if s.PoolBytes > peak {
			t.Fatalf("pool holds %d bytes, more than the peak of live bytes %d", s.PoolBytes, peak)
		}
	}
	s := d.MemStats()
	if s.HitRate() < 0.5 {
		t.Errorf("hit rate %.2f over a long tail of sizes, want at least 0.5 (%+v)", s.HitRate(), s)
	}
	t.Logf("%+v, hit rate %.3f", s, s.HitRate())
}

// TestPoolGivesBackAfterDecay ticks the pool's decay by hand (its timer is
// set an hour off) and checks, after each tick, what the pool holds, that
// the storage it dropped left memory (mincore, on Linux), that the device
// called WithOnIdle's function once it was empty, and that the live bytes
// stay exact, on the device and on its ceiling.
func TestPoolGivesBackAfterDecay(t *testing.T) {
	t.Parallel()
	ceil := NewCeiling(1 << 30)
	idles := 0
	d := NewCPU(1, WithCeiling(ceil), WithOnIdle(func() { idles++ })).(*cpuDevice)
	d.mem.decay = time.Hour
	keep, err := d.Zeros(abi.DTypeFloat32, []int{100})
	if err != nil {
		t.Fatal(err)
	}
	keepBytes := 4 * int64(sizeClass(100))
	exact := func(when string, live int64) {
		t.Helper()
		if s := d.MemStats(); s.LiveBytes != live || ceil.Used() != live {
			t.Fatalf("%s: live bytes %d, ceiling used %d, want both %d", when, s.LiveBytes, ceil.Used(), live)
		}
	}
	sizes := []int{1 << 16, 3 << 16, 5 << 16} // 256 KiB to 1.25 MiB: pages of their own
	var (
		ts     []*Tensor
		bufs   [][]float32 // the storage, to look at after the pool let it go
		pooled int64
	)
	for _, n := range sizes {
		x, err := d.allocDirty(abi.DTypeFloat32, []int{n})
		if err != nil {
			t.Fatal(err)
		}
		f := x.f32()
		for i := range f {
			f[i] = 1
		}
		ts, bufs = append(ts, x), append(bufs, f[:cap(f)])
		pooled += 4 * int64(cap(f))
	}
	exact("with the batch live", keepBytes+pooled)
	d.Release(ts...)
	exact("after the release", keepBytes)
	// resident returns the resident pages of the dropped storage, and how
	// many it has; -1 where the system cannot tell.
	resident := func() (in, all int) {
		for _, b := range bufs {
			r, n, err := pages.Resident(b)
			if err != nil {
				return -1, -1
			}
			in, all = in+r, all+n
		}
		return in, all
	}
	steps := []struct {
		name       string
		pool       int64 // bytes the pool holds after the tick
		dropped    int64
		resident   bool // whether the storage is still in memory
		peakIsLive bool
		idles      int // calls of the idle function so far
	}{
		{"after the release", pooled, 0, true, false, 0},
		{"one tick: the batch's mark is the previous period's", pooled, 0, true, false, 0},
		{"two ticks: the mark is gone", 0, pooled, false, true, 1},
		{"three ticks: nothing more to give back", 0, pooled, false, true, 1},
	}
	for i, st := range steps {
		if i > 0 {
			d.mem.trim()
		}
		s := d.MemStats()
		if s.PoolBytes != st.pool || s.DroppedBytes != st.dropped {
			t.Errorf("%s: pool %d bytes, dropped %d, want %d and %d", st.name, s.PoolBytes, s.DroppedBytes, st.pool, st.dropped)
		}
		if idles != st.idles {
			t.Errorf("%s: the idle function ran %d times, want %d", st.name, idles, st.idles)
		}
		if st.peakIsLive != (s.PeakBytes == s.LiveBytes) {
			t.Errorf("%s: peak %d bytes, live %d", st.name, s.PeakBytes, s.LiveBytes)
		}
		exact(st.name, keepBytes)
		switch in, all := resident(); {
		case in < 0:
			// No residency to look at (not Linux).
		case st.resident && in < all:
			t.Errorf("%s: %d of the pooled storage's %d pages are resident, want all", st.name, in, all)
		case !st.resident && in != 0:
			t.Errorf("%s: %d of the dropped storage's %d pages are still resident, want none", st.name, in, all)
		}
	}
	// The pool is empty and its storage gone; new storage is fresh, and
	// charged exactly again.
	x, err := d.allocDirty(abi.DTypeFloat32, []int{sizes[1]})
	if err != nil {
		t.Fatal(err)
	}
	if s := d.MemStats(); s.PoolMisses != int64(len(sizes))+2 || s.PoolHits != 0 {
		t.Errorf("after the decay: %d hits and %d misses, want 0 and %d", s.PoolHits, s.PoolMisses, len(sizes)+2)
	}
	exact("a new tensor after the decay", keepBytes+4*int64(sizeClass(sizes[1])))
	d.Release(x, keep)
	exact("everything released", 0)
}
