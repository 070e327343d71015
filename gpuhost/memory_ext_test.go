package gpuhost_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestCeiling checks the process-wide ceiling on live tensor bytes: two
// devices share it, an allocation past it is refused with ErrOutOfMemory
// before any memory is touched, and releases and Unreserve make room
// again.
func TestCeiling(t *testing.T) {
	t.Parallel()
	c := gpuhost.NewCeiling(1 << 20)
	a, b := gpuhost.NewCPU(1, gpuhost.WithCeiling(c)), gpuhost.NewCPU(1, gpuhost.WithCeiling(c))
	x := mustZeros(t, a, abi.DTypeFloat32, 128, 1024) // 512 KiB
	y := mustZeros(t, b, abi.DTypeInt32, 96, 1024)    // 384 KiB
	if got := c.Used(); got != 896<<10 {
		t.Fatalf("ceiling used %d bytes, want %d", got, 896<<10)
	}
	tests := []struct {
		name  string
		alloc func() error
	}{
		{"zeros", func() error { _, err := a.Zeros(abi.DTypeFloat32, []int{64, 1024}); return err }},
		{"bytes on the other device", func() error {
			_, err := b.FromBytes(abi.DTypeBool, []int{200 << 10}, make([]byte, 200<<10))
			return err
		}},
		{"reserve", func() error { return b.Reserve(256 << 10) }},
		{"op output", func() error {
			_, err := gpuhost.Apply(a, nil, abi.OpScale, []*gpuhost.Tensor{x}, []float64{2})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.alloc(); !errors.Is(err, gpuhost.ErrOutOfMemory) {
				t.Errorf("got %v, want ErrOutOfMemory", err)
			}
		})
	}
	if s := a.MemStats(); s.Refused != 2 || s.LiveBytes != 512<<10 || s.Limit != 1<<20 {
		t.Errorf("device a after refusals: %+v, want 2 refused and 512 KiB live", s)
	}
	if err := a.Reserve(128 << 10); err != nil {
		t.Fatalf("reserving what fits: %v", err)
	}
	a.Unreserve(128 << 10)
	b.Release(y)
	z, err := gpuhost.Apply(a, nil, abi.OpScale, []*gpuhost.Tensor{x}, []float64{2})
	if err != nil {
		t.Fatalf("the op after a release made room: %v", err)
	}
	a.Release(x, z)
	if got := c.Used(); got != 0 {
		t.Errorf("ceiling used %d bytes after releasing everything, want 0", got)
	}
}

// TestCeilingRefusesBeforeAllocating asks for a tensor far larger than
// the ceiling and checks that the refusal allocated (almost) nothing.
func TestCeilingRefusesBeforeAllocating(t *testing.T) {
	dev := gpuhost.NewCPU(1, gpuhost.WithCeiling(gpuhost.NewCeiling(1<<20)))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := dev.Zeros(abi.DTypeFloat32, []int{1 << 28}) // 1 GiB
	runtime.ReadMemStats(&after)
	if !errors.Is(err, gpuhost.ErrOutOfMemory) {
		t.Fatalf("1 GiB under a 1 MiB ceiling: %v, want ErrOutOfMemory", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("the refusal allocated %d bytes", d)
	}
}

// TestCollectedTensorsStopCounting drops tensors without Release and
// checks that the collector's cleanups give their bytes back.
func TestCollectedTensorsStopCounting(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	for range 10 {
		mustZeros(t, dev, abi.DTypeFloat32, 1000)
		mustZeros(t, dev, abi.DTypeInt64, 10)
	}
	if s := dev.MemStats(); s.LiveBytes == 0 {
		t.Fatalf("live bytes 0 with 20 tensors alive")
	}
	deadline := time.Now().Add(10 * time.Second)
	for dev.MemStats().LiveBytes != 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if s := dev.MemStats(); s.LiveBytes != 0 {
		t.Errorf("live bytes %d after the tensors were collected, want 0", s.LiveBytes)
	}
}
