package batch_test

import (
	"context"
	"testing"

	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/internal/testing/racebuild"
)

// TestUnsplitSubmitAllocations bounds the allocations of a one-piece
// request's whole cycle (Submit, then RunBatch from the notify hook), as
// one-row requests are the server's commonest: the request, its piece and
// its result share one allocation. The bound is what the cycle costs
// today; a change that adds to it should say why.
func TestUnsplitSubmitAllocations(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector allocates on its own account")
	}
	var p *batch.Pool[int, int]
	ctx := context.Background()
	p = batch.NewPool(batch.Limits{}, batch.Ops[int, int]{
		Rows: func(int) int { return 1 },
		Run:  func(_ context.Context, reqs []int) ([]int, error) { return reqs, nil },
	}, nil, func() { p.RunBatch(ctx) })
	const most = 16
	n := testing.AllocsPerRun(200, func() {
		if got, err := p.Submit(ctx, 7); err != nil || got != 7 {
			t.Fatalf("Submit = %d, %v; want 7", got, err)
		}
	})
	t.Logf("%v allocations per request", n)
	if n > most {
		t.Errorf("a one-piece request cost %v allocations, want at most %d", n, most)
	}
}
