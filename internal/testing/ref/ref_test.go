package ref

import (
	"math"
	"testing"
)

// TestKernels checks each reference on a case worked by hand, so that a
// wrong reference fails here, not as every device's failure.
func TestKernels(t *testing.T) {
	t.Parallel()
	a := []float64{1, 2, 3, 4, 5, 6} // 2×3
	b := []float64{1, 0, 2, 1, 0, 3} // 3×2
	g1 := 0.5 * (1 + math.Tanh(math.Sqrt(2/math.Pi)*1.044715))
	for _, tc := range []struct {
		name      string
		got, want []float64
	}{
		{name: "matmul", got: MatMul(false, false, 2, 2, 3, a, b), want: []float64{5, 11, 14, 23}},
		{name: "matmul ta tb", got: MatMul(true, true, 2, 2, 3, []float32{1, 4, 2, 5, 3, 6}, []float32{1, 2, 0, 0, 1, 3}), want: []float64{5, 11, 14, 23}},
		{name: "linear", got: Linear(a, []float64{1, 0, 1, 0, 1, 0}, []float64{10, 20}, 3, 2), want: []float64{14, 22, 20, 25}},
		{name: "linear no bias", got: Linear(a, []float64{1, 1, 1}, nil, 3, 1), want: []float64{6, 15}},
		{name: "add broadcast", got: Add([]float64{1, 2}, a), want: []float64{2, 4, 4, 6, 6, 8}},
		{name: "gelu", got: GeluTanh([]float64{0, 1}), want: []float64{0, g1}},
		{name: "layer norm", got: LayerNorm([]float64{1, 3, 4, 8}, []float64{2, 1}, []float64{0, 1}, 0), want: []float64{-2, 2, -2, 2}},
		{name: "dot", got: []float64{Dot(a, a)}, want: []float64{91}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.got) != len(tc.want) {
				t.Fatalf("%d values, want %d", len(tc.got), len(tc.want))
			}
			for i := range tc.want {
				if math.Abs(tc.got[i]-tc.want[i]) > 1e-12 {
					t.Errorf("[%d] = %v, want %v (all: %v)", i, tc.got[i], tc.want[i], tc.got)
				}
			}
		})
	}
}

func TestRelErr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		got  []float32
		want []float64
		err  float64
	}{
		{name: "equal", got: []float32{1, 2}, want: []float64{1, 2}, err: 0},
		{name: "off", got: []float32{3, 0}, want: []float64{0, 4}, err: 5.0 / 4},
		{name: "zero want", got: []float32{3, 4}, want: []float64{0, 0}, err: 5},
		{name: "NaN", got: []float32{float32(math.NaN()), 1}, want: []float64{1, 1}, err: math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e := RelErr(tc.got, tc.want); e != tc.err {
				t.Errorf("RelErr(%v, %v) = %v, want %v", tc.got, tc.want, e, tc.err)
			}
		})
	}
}
