package gpuhost

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/moehost/moehost/abi"
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
