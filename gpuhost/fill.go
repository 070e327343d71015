package gpuhost

import "fmt"

// Fill overwrites the float32 tensor dst in place with what fill writes
// into the slice it gets, which holds dst's length and old values (or
// garbage) and must be written whole: on the CPU it is dst's own storage,
// so a parameter read from a checkpoint or drawn late is written once;
// other devices get a host slice that is then copied in. An error from
// fill is returned as it is, and may leave dst partly written.
func Fill(dst *Tensor, fill func([]float32) error) error {
	if dst == nil || dst.dev == nil {
		return fmt.Errorf("%w: fill: not a device tensor", ErrArgument)
	}
	if err := checkFloat(dst.dev, dst); err != nil {
		return fmt.Errorf("%w: fill: %w", ErrArgument, err)
	}
	if _, ok := dst.dev.(*cpuDevice); ok {
		return fill(dst.f32())
	}
	vals := make([]float32, dst.n)
	if err := fill(vals); err != nil {
		return err
	}
	return Assign(dst, vals)
}
