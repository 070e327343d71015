package sandbox

import (
	"context"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// lowPriority runs f on an OS thread of its own at the lowest scheduling
// priority (nice 19), so that a compile, or a new instance's moe_init,
// yields the CPU to the kernels of other tenants' calls on a busy host.
// The thread is never unlocked: it ends with its goroutine, and its
// priority with it (raising it back would need a privilege).
//
// When cpu is positive, f's context also ends once the thread has run for
// cpu on a core, and lowPriority reports it. That budget, not wall time,
// is what bounds a spinning guest: at nice 19 on a saturated host a
// harmless init may wait far longer for a core than any wall timeout,
// and the wait takes nothing from anyone.
func lowPriority(ctx context.Context, cpu time.Duration, f func(context.Context)) (overCPU bool) {
	done := make(chan struct{})
	var p any
	go func() {
		defer close(done)
		// A panic belongs to the caller, where recovery (if any) is.
		defer func() { p = recover() }()
		runtime.LockOSThread()
		tid := syscall.Gettid()
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, 19)
		if cpu <= 0 {
			f(ctx)
			return
		}
		fctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := make(chan struct{})
		watched := make(chan bool, 1)
		go func() { watched <- watchThreadCPU(tid, cpu, stop, cancel) }()
		f(fctx)
		close(stop)
		overCPU = <-watched
	}()
	<-done
	if p != nil {
		panic(p)
	}
	return overCPU
}

// watchThreadCPU calls cancel and returns true once thread tid of this
// process has run for budget, polling its CPU clock; it returns false
// when stop closes first. The thread must outlive stop.
func watchThreadCPU(tid int, budget time.Duration, stop <-chan struct{}, cancel func()) bool {
	// The kernel's per-thread CPU clock (MAKE_THREAD_CPUCLOCK with
	// CPUCLOCK_SCHED), which any thread of the process may read.
	clock := int32(^uint32(tid))<<3 | 6
	// The thread may have run other goroutines before it was locked: its
	// clock counts from the thread's start, the budget from now.
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		<-stop // a clock the kernel will not read leaves the wall-time bound
		return false
	}
	base := time.Duration(ts.Nano())
	tick := time.NewTicker(min(budget/20, 20*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return false
		case <-tick.C:
		}
		if err := unix.ClockGettime(clock, &ts); err != nil {
			continue
		}
		if time.Duration(ts.Nano())-base >= budget {
			cancel()
			return true
		}
	}
}

// initWallFactor is how many times its CPU budget an init may take in wall
// time (Instantiate).
const initWallFactor = 4
