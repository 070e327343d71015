package pages

import (
	"testing"
	"unsafe"
)

// resident returns how many of the whole pages inside b are in memory.
func resident(t *testing.T, b []float32) int {
	t.Helper()
	r, _, err := Resident(b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDiscard checks that a touched buffer's pages leave memory, that it
// reads as zeros afterwards and can be written again, and that a small
// buffer is left alone.
func TestDiscard(t *testing.T) {
	b := make([]float32, 1<<18) // 1 MiB
	for i := range b {
		b[i] = float32(i + 1)
	}
	pagesIn := (4*len(b))/pageBytes - 1 // the edges may be partial pages
	if r := resident(t, b); r < pagesIn {
		t.Fatalf("%d of the written buffer's pages are resident, want at least %d", r, pagesIn)
	}
	got := Discard(b)
	if got < int64(pagesIn)*pageBytes || got > 4*int64(len(b)) {
		t.Errorf("Discard gave back %d bytes of a %d-byte buffer", got, 4*len(b))
	}
	if r := resident(t, b); r != 0 {
		t.Errorf("%d pages resident after Discard, want 0", r)
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), 4*len(b))
	lo, hi := pageRange(uintptr(unsafe.Pointer(&raw[0])), len(raw))
	for i := lo / 4; i < hi/4; i++ {
		if b[i] != 0 {
			t.Fatalf("b[%d] = %g after Discard, want 0", i, b[i])
		}
	}
	for i := range b {
		b[i] = 2
	}
	for i := range b {
		if b[i] != 2 {
			t.Fatalf("b[%d] = %g after writing 2 again", i, b[i])
		}
	}

	small := make([]byte, MinBytes/2)
	for i := range small {
		small[i] = 7
	}
	if got := Discard(small); got != 0 {
		t.Errorf("Discard of a %d-byte buffer gave back %d bytes, want 0", len(small), got)
	}
	for i, v := range small {
		if v != 7 {
			t.Fatalf("small[%d] = %d after Discard, want it untouched", i, v)
		}
	}
}
