package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// helperSpin is how long a helper goroutine, its chunk done, polls for the
// next before it exits, and how long a kernel's caller polls for its
// helpers before it sleeps. Waking a sleeping thread on an idle core of a
// VM took 100 µs at the median and up to 1 ms (Zen 5, a pvm guest): a
// tenth of a 2-thread GEMM at m = 64. The kernels of one op follow each
// other within microseconds, so a short poll finds them; OpenBLAS's
// workers poll for 2^28 cycles (about 0.1 s), which a server shared by
// tenants cannot spare.
const helperSpin = 200 * time.Microsecond

// helperPool hands kernel chunks to goroutines that are still polling
// after their last chunk, and starts new ones when none is. Goroutines
// exit after helperSpin without work, so an idle host runs none.
type helperPool struct {
	idle  atomic.Int32 // polling helpers that no chunk has claimed
	tasks chan func()
}

// helpers serves every CPU device of the process.
var helpers = helperPool{tasks: make(chan func(), 16)}

// run runs task on a polling helper, or on a new goroutine.
func (p *helperPool) run(task func()) {
	for {
		n := p.idle.Load()
		if n <= 0 {
			go p.helper(task)
			return
		}
		// Claiming a polling helper first means one will take the chunk
		// off the channel: the send never waits for long.
		if p.idle.CompareAndSwap(n, n-1) {
			p.tasks <- task
			return
		}
	}
}

// helper runs task and then whatever chunks reach it while it polls.
func (p *helperPool) helper(task func()) {
	for task != nil {
		task()
		task = p.next()
	}
}

// next polls for a chunk for helperSpin and returns it, or nil once the
// helper may exit.
func (p *helperPool) next() func() {
	p.idle.Add(1)
	start := time.Now()
	for {
		select {
		case t := <-p.tasks:
			return t
		default:
		}
		if time.Since(start) > helperSpin {
			return p.leave()
		}
		// Lets the P run any goroutine that is waiting for it.
		runtime.Gosched()
	}
}

// leave withdraws a polling helper that found no chunk. It returns nil
// when the helper may exit, or the chunk of a run that had claimed it
// first: that chunk is on its way and no other helper will take it.
func (p *helperPool) leave() func() {
	for {
		n := p.idle.Load()
		if n <= 0 {
			return <-p.tasks
		}
		if p.idle.CompareAndSwap(n, n-1) {
			return nil
		}
	}
}

// Join is a sync.WaitGroup for kernel chunks: Go runs a chunk on a
// polling helper (helperPool), and Wait polls for helperSpin before it
// sleeps, so that neither side pays a thread's wake-up between two
// kernels.
type Join struct {
	left atomic.Int32
	wg   sync.WaitGroup
}

// Go runs f on a helper.
func (j *Join) Go(f func()) {
	j.left.Add(1)
	j.wg.Add(1)
	helpers.run(func() {
		defer func() {
			j.left.Add(-1)
			j.wg.Done()
		}()
		f()
	})
}

// Wait returns once every chunk passed to Go has returned.
func (j *Join) Wait() {
	start := time.Now()
	for j.left.Load() > 0 && time.Since(start) <= helperSpin {
		runtime.Gosched()
	}
	j.wg.Wait()
}
