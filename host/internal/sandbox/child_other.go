//go:build !linux

package sandbox

import "os"

func selfExe() (string, error) { return os.Executable() }

// limitMemory does nothing off Linux: the child's memory limit is only
// the collector's soft one (debug.SetMemoryLimit).
func limitMemory(int64) error { return nil }
