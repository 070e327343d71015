//go:build amd64 && !purego

package gpuhost

// adamAVX2 runs one Adam step over n elements (a multiple of 8), as
// adamStep's scalar loop does with coupled weight decay. Implemented in
// adam_amd64.s.
//
//go:noescape
func adamAVX2(p, grad, m, v *float32, n int, k *adamLanes, wd bool)

// adamVec runs adamAVX2 over the whole 8-lane part of p and returns how
// many elements it did. Call it only when the device's asm field is set.
func adamVec(p, g, m, v []float32, k *adamLanes, wd bool) int {
	n := len(p) &^ 7
	if n == 0 {
		return 0
	}
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	adamAVX2(&p[0], &g[0], &m[0], &v[0], n, k, wd)
	return n
}
