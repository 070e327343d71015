package cpu

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestJoinRunsEveryChunkOnce drives many joins at once, so that chunks
// meet helpers that are polling, claimed, or exiting: each chunk must run
// exactly once and before its Wait returns.
func TestJoinRunsEveryChunkOnce(t *testing.T) {
	const callers, rounds, chunks = 8, 300, 3
	ran := make([]atomic.Int32, callers*rounds*chunks)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for r := range rounds {
					base := (c*rounds + r) * chunks
					var j Join
					for k := range chunks {
						j.Go(func() {
							if r%7 == 0 && k == 0 {
								// Outlasts Wait's poll, so Wait must sleep.
								time.Sleep(2 * helperSpin)
							}
							ran[base+k].Add(1)
						})
					}
					j.Wait()
					for k := range chunks {
						if n := ran[base+k].Load(); n != 1 {
							t.Errorf("caller %d round %d chunk %d: ran %d times when Wait returned", c, r, k, n)
						}
					}
					// Pauses about as long as a helper polls, so that
					// helpers time out while new chunks arrive.
					time.Sleep(time.Duration(r%5) * helperSpin / 3)
				}
			})
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("joins did not finish: a chunk was lost")
	}
	for i := range ran {
		if n := ran[i].Load(); n != 1 {
			t.Fatalf("chunk %d ran %d times", i, n)
		}
	}
}

// TestHelpersExitWhenIdle checks that an idle host runs no helper: the
// goroutines and the pool's idle count go back to where they were.
func TestHelpersExitWhenIdle(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 20 {
		var j Join
		for range 4 {
			j.Go(func() {})
		}
		j.Wait()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before || helpers.idle.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("helpers did not exit: %d goroutines (%d before), idle count %d",
				runtime.NumGoroutine(), before, helpers.idle.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHelperTakesNextChunk checks the point of the pool: a chunk handed
// out while a helper polls runs on that helper, not on a new goroutine.
// A helper may time out between the check and the hand-off on a busy
// machine, so the test passes on the first of a few tries that reuses.
func TestHelperTakesNextChunk(t *testing.T) {
	p := helperPool{tasks: make(chan func(), 1)}
	for range 20 {
		ids := make(chan string, 1)
		p.run(func() { ids <- goroutineID() })
		first := <-ids
		for p.idle.Load() == 0 {
			runtime.Gosched() // until the helper polls
		}
		p.run(func() { ids <- goroutineID() })
		if <-ids == first {
			return
		}
	}
	t.Fatal("no chunk ran on the helper that was polling for it")
}

// goroutineID is the number in the first line of the caller's stack.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// TestLeaveTakesClaimedChunk covers the race in which run claims a helper
// just as its poll times out: the helper must take the chunk that is on
// its way, or that chunk never runs.
func TestLeaveTakesClaimedChunk(t *testing.T) {
	p := helperPool{tasks: make(chan func(), 1)}
	ran := false
	// What run does between the helper's poll and its leave: claim the
	// helper (idle 1 -> 0) and send the chunk.
	p.idle.Store(0)
	p.tasks <- func() { ran = true }
	task := p.leave()
	if task == nil {
		t.Fatal("leave let a claimed helper exit with its chunk unrun")
	}
	task()
	if !ran {
		t.Fatal("leave returned another chunk than the claimed one")
	}

	// Unclaimed, the helper withdraws itself and exits.
	p.idle.Store(1)
	if task := p.leave(); task != nil || p.idle.Load() != 0 {
		t.Fatalf("unclaimed leave: task %v, idle %d; want nil, 0", task != nil, p.idle.Load())
	}
}
