package sandbox

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// drawParam declares one parameter in a fresh store and returns its values.
func drawParam(t *testing.T, seed, name string, n int, init abi.Init, a, b float64) []float32 {
	t.Helper()
	dev := gpuhost.NewCPU(1)
	s := NewParamStore(dev, []byte(seed), 0)
	p, err := s.declare(name, abi.DTypeFloat32, []int{n}, init, a, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Draw(); err != nil {
		t.Fatal(err)
	}
	v, err := dev.Float32s(p)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// moments returns the mean, standard deviation, min and max of v.
func moments(v []float32) (mean, std, lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		mean += float64(x)
		lo, hi = min(lo, float64(x)), max(hi, float64(x))
	}
	mean /= float64(len(v))
	for _, x := range v {
		d := float64(x) - mean
		std += d * d
	}
	return mean, math.Sqrt(std / float64(len(v))), lo, hi
}

// TestInitDistributions checks the initial values statistically: mean,
// standard deviation and bounds within a few standard errors, per chunk
// as well as overall, so that a wrong scale, a shift, a constant or a
// chunk that repeats another fails. n is not a multiple of the chunk, so
// the odd tail is drawn too.
func TestInitDistributions(t *testing.T) {
	const n = 5*initChunk + 3
	tests := []struct {
		name      string
		init      abi.Init
		a, b      float64
		mean, std float64
		lo, hi    float64 // the values must lie within [lo, hi]
	}{
		{"uniform", abi.InitUniform, -0.5, 1.5, 0.5, 2 / math.Sqrt(12), -0.5, 1.5},
		{"uniform-narrow", abi.InitUniform, 3, 3.001, 3.0005, 0.001 / math.Sqrt(12), 3, 3.001},
		{"normal", abi.InitNormal, 2, 3, 2, 3, math.Inf(-1), math.Inf(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := drawParam(t, "stats", "w", n, tt.init, tt.a, tt.b)
			check := func(what string, v []float32) {
				t.Helper()
				mean, std, lo, hi := moments(v)
				se := tt.std / math.Sqrt(float64(len(v)))
				if math.Abs(mean-tt.mean) > 6*se {
					t.Errorf("%s: mean %g, want %g ± %g", what, mean, tt.mean, 6*se)
				}
				if math.Abs(std/tt.std-1) > 0.03 {
					t.Errorf("%s: std %g, want %g ± 3%%", what, std, tt.std)
				}
				if lo < tt.lo || hi > tt.hi {
					t.Errorf("%s: values in [%g, %g], outside [%g, %g]", what, lo, hi, tt.lo, tt.hi)
				}
				// Neighbours are uncorrelated (two values come from one
				// 64-bit draw).
				var cov float64
				for i := 1; i < len(v); i++ {
					cov += (float64(v[i-1]) - mean) * (float64(v[i]) - mean)
				}
				if r := cov / float64(len(v)-1) / (std * std); math.Abs(r) > 6/math.Sqrt(float64(len(v))) {
					t.Errorf("%s: neighbours correlate: r = %g", what, r)
				}
				if tt.init == abi.InitUniform {
					// The ends are reached: the range is not a narrower one.
					if e := 0.01 * (tt.hi - tt.lo); lo > tt.lo+e || hi < tt.hi-e {
						t.Errorf("%s: values in [%g, %g], want them to reach [%g, %g] within %g", what, lo, hi, tt.lo, tt.hi, e)
					}
				} else {
					// Normal: about 68.27% within one std, 0.27% beyond three.
					var in1, out3 int
					for _, x := range v {
						z := math.Abs(float64(x)-tt.mean) / tt.std
						if z < 1 {
							in1++
						}
						if z > 3 {
							out3++
						}
					}
					if f := float64(in1) / float64(len(v)); math.Abs(f-0.6827) > 0.01 {
						t.Errorf("%s: %.4f within one std, want 0.6827", what, f)
					}
					if f := float64(out3) / float64(len(v)); f < 0.0015 || f > 0.004 {
						t.Errorf("%s: %.4f beyond three std, want 0.0027", what, f)
					}
				}
			}
			check("all", v)
			for c := 0; c*initChunk < n; c++ {
				if c > 0 && slices.Equal(v[:16], v[c*initChunk:c*initChunk+16]) {
					t.Errorf("chunk %d starts like chunk 0", c)
				}
				if (c+1)*initChunk <= n {
					check("chunk "+string(rune('0'+c)), v[c*initChunk:(c+1)*initChunk])
				}
			}
		})
	}
}

// TestInitDeterministic checks that the values depend on the seed and the
// name only: not on the number of cores that drew them.
func TestInitDeterministic(t *testing.T) {
	const n = 9*initChunk + 1
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, init := range []abi.Init{abi.InitUniform, abi.InitNormal} {
		runtime.GOMAXPROCS(1)
		one := drawParam(t, "seed", "layer.weight", n, init, -1, 1)
		runtime.GOMAXPROCS(2)
		two := drawParam(t, "seed", "layer.weight", n, init, -1, 1)
		if !slices.Equal(one, two) {
			t.Errorf("init %v: values drawn on 1 and 2 cores differ", init)
		}
		if slices.Equal(one[:64], drawParam(t, "seed", "layer.bias", n, init, -1, 1)[:64]) {
			t.Errorf("init %v: two names give the same values", init)
		}
		if slices.Equal(one[:64], drawParam(t, "other", "layer.weight", n, init, -1, 1)[:64]) {
			t.Errorf("init %v: two seeds give the same values", init)
		}
	}
}

// TestInitConstants checks zeros and ones, which are written into storage
// that may hold an earlier tensor's values.
func TestInitConstants(t *testing.T) {
	dev := gpuhost.NewCPU(1)
	// Leave dirty storage of the size class in the device's pool.
	junk, err := dev.FromFloat32([]int{1000}, slices.Repeat([]float32{7}, 1000))
	if err != nil {
		t.Fatal(err)
	}
	dev.Release(junk)
	s := NewParamStore(dev, []byte("c"), 0)
	for _, tt := range []struct {
		init abi.Init
		want float32
	}{{abi.InitZeros, 0}, {abi.InitOnes, 1}} {
		p, err := s.declare(fmt.Sprint("c", tt.init), abi.DTypeFloat32, []int{1000}, tt.init, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Draw(); err != nil {
			t.Fatal(err)
		}
		v, _ := dev.Float32s(p)
		for i, x := range v {
			if x != tt.want {
				t.Fatalf("%v: value %d is %g", tt.init, i, x)
			}
		}
	}
}
