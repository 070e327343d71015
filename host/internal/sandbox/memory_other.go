//go:build !linux

package sandbox

import "github.com/tetratelabs/wazero/experimental"

// mmapAllocator is nil off Linux: wazero's default allocator.
var mmapAllocator experimental.MemoryAllocator
