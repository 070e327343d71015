//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"regexp"
	"slices"
)

// kernelArgs packs args into 8-byte slots, one per parameter:
// cuLaunchKernel reads each parameter's own size from its slot, and
// gorgonia.org/cu copies 8 bytes from each (little-endian, so a 4-byte
// value sits in the slot's low half). sig names each argument's C type
// by a letter (p pointer, i int, l long long, u unsigned, f float, d
// double), which the emulator checks against the kernel's signature.
func kernelArgs(kernel string, args []any) (slots []uint64, sig []byte, err error) {
	slots = make([]uint64, len(args))
	sig = make([]byte, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case Ptr:
			slots[i], sig[i] = uint64(v), 'p'
		case int32:
			slots[i], sig[i] = uint64(uint32(v)), 'i'
		case int64:
			slots[i], sig[i] = uint64(v), 'l'
		case uint32:
			slots[i], sig[i] = uint64(v), 'u'
		case float32:
			slots[i], sig[i] = uint64(math.Float32bits(v)), 'f'
		case float64:
			slots[i], sig[i] = math.Float64bits(v), 'd'
		default:
			return nil, nil, fmt.Errorf("cuda: launch %s: argument %d has type %T (want Ptr, int32, int64, uint32, float32 or float64)", kernel, i, a)
		}
	}
	return slots, sig, nil
}

// ptxParams returns each kernel's parameter types as the PTX declares
// them (".u64", ".u32", ".f32", ".f64"), by entry name.
func ptxParams(ptx string) map[string][]string {
	out := map[string][]string{}
	for _, m := range ptxEntry.FindAllStringSubmatch(ptx, -1) {
		var types []string
		for _, p := range ptxParam.FindAllStringSubmatch(m[2], -1) {
			types = append(types, p[1])
		}
		out[m[1]] = types
	}
	return out
}

var (
	ptxEntry = regexp.MustCompile(`\.entry\s+(\w+)\s*\(([^)]*)\)`)
	ptxParam = regexp.MustCompile(`\.param\s+(\.\w+)\s`)
)

// checkParams refuses args that do not match the kernel's parameters in
// count, size and kind. On a GPU a mismatch is no error but garbage
// arguments, and the illegal address that follows is sticky: it breaks
// the context for every later call, so the real backend checks first, as
// the emulator does against its C++ signatures.
func checkParams(kernel string, params []string, args []any) error {
	if len(args) != len(params) {
		return fmt.Errorf("cuda: launch %s: %d arguments for %d parameters", kernel, len(args), len(params))
	}
	for i, a := range args {
		var want []string
		switch a.(type) {
		case Ptr, int64:
			want = []string{".u64", ".s64", ".b64"}
		case int32, uint32:
			want = []string{".u32", ".s32", ".b32"}
		case float32:
			want = []string{".f32"}
		case float64:
			want = []string{".f64"}
		}
		if !slices.Contains(want, params[i]) {
			return fmt.Errorf("cuda: launch %s: argument %d is a %T, but the parameter is %s", kernel, i, a, params[i])
		}
	}
	return nil
}
