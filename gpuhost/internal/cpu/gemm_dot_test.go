package cpu

import (
	"math/rand/v2"
	"testing"
)

// TestDotTilesMatchBuffered checks that the dot kernels that store their
// own tiles (gemmDotTiles3x4, 2x4, 1x4, gemmDotTile4x6) give the bits of
// the buffered kernels they replace, stores, adds and biases alike, on
// each dot path this CPU runs: row counts around every tile height,
// ragged column blocks, and k past the kernels' multiples (which the
// buffered path keeps).
func TestDotTilesMatchBuffered(t *testing.T) {
	var wides []bool
	for _, p := range Paths() {
		switch p {
		case PathAVX2:
			wides = append(wides, false)
		case PathAVX512:
			wides = append(wides, true)
		}
	}
	if len(wides) == 0 {
		t.Skip("no assembly dot kernels on this CPU and build")
	}
	defer func() { gemmAB = 0 }()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, wide := range wides {
		ran := 0
		for _, m := range []int{1, 2, 3, 4, 5, 7, 8, 11, 12, 13} {
			for _, nk := range [][2]int{{16, 16}, {29, 48}, {53, 64}, {24, 40}, {40, 1024}} {
				n, k := nk[0], nk[1]
				a, b, bias := randSlice(rng, m*k), randSlice(rng, n*k), randSlice(rng, n)
				c0 := randSlice(rng, m*n)
				for _, acc := range []bool{false, true} {
					for _, bs := range [][]float32{nil, bias} {
						var out [2][]float32
						for i, ab := range []int{128, 0} {
							gemmAB = ab
							out[i] = append([]float32(nil), c0...)
							gemmDotSerial(wide, m, n, k, a, k, b, k, out[i], n, acc, bs)
						}
						for i := range out[0] {
							if out[0][i] != out[1][i] {
								t.Fatalf("wide=%t m=%d n=%d k=%d acc=%t bias=%t: c[%d] = %v, buffered %v",
									wide, m, n, k, acc, bs != nil, i, out[1][i], out[0][i])
							}
						}
						ran++
					}
				}
			}
		}
		t.Logf("wide=%t: %d products bitwise equal", wide, ran)
	}
}
