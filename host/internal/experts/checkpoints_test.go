package experts

import (
	"testing"

	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/internal/pages"
)

// TestDiscardSnapshot checks that a written snapshot's parameters and
// optimizer state both leave memory (on Linux, where residency is known).
func TestDiscardSnapshot(t *testing.T) {
	t.Parallel()
	fill := func() []float32 {
		b := make([]float32, 1<<17) // 512 KiB
		for i := range b {
			b[i] = 1
		}
		return b
	}
	s := &snapshot{
		Params: []checkpoint.Tensor{{Name: "w", Data: fill()}},
		Optim:  []checkpoint.Tensor{{Name: "w.exp_avg", Data: fill()}, {Name: "w.exp_avg_sq", Data: fill()}},
	}
	if _, _, err := pages.Resident(s.Params[0].Data); err != nil {
		t.Skip(err)
	}
	discardSnapshot(s)
	for _, ts := range [][]checkpoint.Tensor{s.Params, s.Optim} {
		for _, x := range ts {
			if in, all, _ := pages.Resident(x.Data); in != 0 {
				t.Errorf("%s: %d of %d pages resident after the discard, want none", x.Name, in, all)
			}
		}
	}
}
