//go:build !amd64 || purego

package cpu

// cpuidFunc is nil where there is no CPUID (or no assembly): the caches
// come from sysfs or fallbackCaches alone.
var cpuidFunc func(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
