package gpuhost_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestFill overwrites a tensor in place on every device: the tensor keeps
// its identity and holds exactly what fill wrote, fill's error comes back
// as it is, and a tensor of another dtype is refused before fill runs.
func TestFill(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			x, err := d.dev.FromFloat32([]int{3, 5}, make([]float32, 15))
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, 15)
			for i := range want {
				want[i] = float32(i)*0.5 - 3
			}
			err = gpuhost.Fill(x, func(dst []float32) error {
				if len(dst) != 15 {
					t.Errorf("fill got %d values, want 15", len(dst))
				}
				copy(dst, want)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.dev.Float32s(x)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("after Fill: %v, want %v", got, want)
			}
			boom := errors.New("boom")
			if err := gpuhost.Fill(x, func([]float32) error { return boom }); err != boom {
				t.Fatalf("Fill's error: %v, want fill's own", err)
			}
			ints, err := d.dev.Zeros(abi.DTypeInt32, []int{4})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			if err := gpuhost.Fill(ints, func([]float32) error { ran = true; return nil }); !errors.Is(err, gpuhost.ErrArgument) || ran {
				t.Fatalf("Fill of an int32 tensor: %v (fill ran: %v), want ErrArgument before fill", err, ran)
			}
		})
	}
}
