package cpu

import "testing"

// TestHugeRange checks that the advised range is whole huge pages inside
// the buffer, and empty for small buffers.
func TestHugeRange(t *testing.T) {
	const hp = hugePageBytes
	tests := []struct {
		p      uintptr
		n      int
		lo, hi int
	}{
		{0x1000, 1 << 20, 0, 0},            // small
		{0x1000, 2*hp - 1, 0, 0},           // just under 4 MiB
		{hp, 2 * hp, 0, 2 * hp},            // aligned: all of it
		{hp + 8, 2 * hp, hp - 8, 2*hp - 8}, // unaligned 4 MiB: one whole page
		{hp + 8, 3 * hp, hp - 8, 3*hp - 8},
		{5*hp - 4096, 10*hp + 4096 + 12, 4096, 4096 + 10*hp},
	}
	for _, tt := range tests {
		lo, hi := hugeRange(tt.p, tt.n)
		if tt.lo == tt.hi {
			if lo < hi {
				t.Errorf("hugeRange(%#x, %d) = [%d, %d), want empty", tt.p, tt.n, lo, hi)
			}
			continue
		}
		if lo != tt.lo || hi != tt.hi {
			t.Errorf("hugeRange(%#x, %d) = [%d, %d), want [%d, %d)", tt.p, tt.n, lo, hi, tt.lo, tt.hi)
		}
		if (tt.p+uintptr(lo))%hp != 0 || (tt.p+uintptr(hi))%hp != 0 || lo < 0 || hi > tt.n {
			t.Errorf("hugeRange(%#x, %d) = [%d, %d): not whole huge pages inside the buffer", tt.p, tt.n, lo, hi)
		}
	}
}
