package pages

import "testing"

// TestPageRange checks that the range is whole pages inside the buffer,
// and empty for small buffers.
func TestPageRange(t *testing.T) {
	t.Parallel()
	const pg = pageBytes
	tests := []struct {
		name   string
		p      uintptr
		n      int
		lo, hi int
	}{
		{"small", 0x1000, MinBytes - 1, 0, 0},
		{"aligned", 0x10000, MinBytes, 0, MinBytes},
		{"unaligned both ends", 0x10008, MinBytes, pg - 8, MinBytes - 8},
		{"unaligned start", 0x10008, MinBytes + pg - 8, pg - 8, MinBytes + pg - 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lo, hi := pageRange(tt.p, tt.n)
			if tt.lo == tt.hi {
				if lo < hi {
					t.Errorf("pageRange(%#x, %d) = [%d, %d), want empty", tt.p, tt.n, lo, hi)
				}
				return
			}
			if lo != tt.lo || hi != tt.hi {
				t.Errorf("pageRange(%#x, %d) = [%d, %d), want [%d, %d)", tt.p, tt.n, lo, hi, tt.lo, tt.hi)
			}
			if (tt.p+uintptr(lo))%pg != 0 || (tt.p+uintptr(hi))%pg != 0 || lo < 0 || hi > tt.n {
				t.Errorf("pageRange(%#x, %d) = [%d, %d): not whole pages inside the buffer", tt.p, tt.n, lo, hi)
			}
		})
	}
}
