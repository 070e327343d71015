package sandbox

import (
	"runtime"
	"syscall"
)

// lowPriority runs f on an OS thread of its own at the lowest scheduling
// priority (nice 19), so that a compile, or a new instance's moe_init,
// yields the CPU to the kernels of other tenants' calls on a busy host. The thread is never unlocked: it
// ends with its goroutine, and its priority with it (raising it back would
// need a privilege).
func lowPriority(f func()) {
	done := make(chan struct{})
	var p any
	go func() {
		defer close(done)
		// A panic belongs to the caller, where recovery (if any) is.
		defer func() { p = recover() }()
		runtime.LockOSThread()
		_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19)
		f()
	}()
	<-done
	if p != nil {
		panic(p)
	}
}
