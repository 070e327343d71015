//go:build !linux

package sandbox

// lowPriority runs f; only Linux lowers the priority of one thread.
func lowPriority(f func()) { f() }
