//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
)

// kernelArgs packs args into 8-byte slots, one per parameter:
// cuLaunchKernel reads each parameter's own size from its slot, and
// gorgonia.org/cu copies 8 bytes from each (little-endian, so a 4-byte
// value sits in the slot's low half).
func kernelArgs(kernel string, args []any) ([]uint64, error) {
	slots := make([]uint64, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case Ptr:
			slots[i] = uint64(v)
		case int32:
			slots[i] = uint64(uint32(v))
		case int64:
			slots[i] = uint64(v)
		case uint32:
			slots[i] = uint64(v)
		case float32:
			slots[i] = uint64(math.Float32bits(v))
		case float64:
			slots[i] = math.Float64bits(v)
		default:
			return nil, fmt.Errorf("cuda: launch %s: argument %d has type %T (want Ptr, int32, int64, uint32, float32 or float64)", kernel, i, a)
		}
	}
	return slots, nil
}
