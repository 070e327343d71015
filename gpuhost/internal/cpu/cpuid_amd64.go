//go:build amd64 && !purego

package cpu

// cpuid executes CPUID with EAX = leaf and ECX = sub. Implemented in
// cpuid_amd64.s.
//
//go:noescape
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)

// cpuidFunc is the CPU's CPUID, for machineCaches.
var cpuidFunc = cpuid
