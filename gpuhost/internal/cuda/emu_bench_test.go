//go:build cudaemu

package cuda

import "testing"

// BenchmarkEmuLaunch measures the emulator's cost per thread: a fill of
// 1<<20 floats over 4096 blocks of 256 threads (a fiber each) and the
// same over one block that strides, to separate fiber switches from
// the loop.
func BenchmarkEmuLaunch(b *testing.B) {
	c, err := Open(0, Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const n = 1 << 20
	p, err := c.Alloc(4 * n)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		grid uint32
	}{{"4096-blocks", 4096}, {"1-block", 1}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := c.Launch("moe_fill_f32", Dim3{tc.grid, 1, 1}, Dim3{256, 1, 1}, 0, p, float32(1), int64(n)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
