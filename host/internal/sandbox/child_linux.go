package sandbox

import (
	"fmt"
	"syscall"
)

// selfExe is the running binary: /proc/self/exe still runs it after an
// upgrade replaced the file.
func selfExe() (string, error) { return "/proc/self/exe", nil }

// limitMemory caps the process's data segment (RLIMIT_DATA: since Linux
// 4.7, every private writable mapping, so the Go heap and wazero's code
// buffers), so that a compile past the limit fails its allocation.
func limitMemory(n int64) error {
	lim := syscall.Rlimit{Cur: uint64(n), Max: uint64(n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &lim); err != nil {
		return fmt.Errorf("setting RLIMIT_DATA to %d: %w", n, err)
	}
	return nil
}
