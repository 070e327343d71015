//go:build amd64 && !purego

package cpu

// adamAVX2 runs one Adam step over n elements (a multiple of 8), as
// adamStep's scalar loop does with coupled weight decay. Implemented in
// adam_amd64.s.
//
//go:noescape
func adamAVX2(p, grad, m, v *float32, n int, k *AdamLanes, wd bool)

// adamAVX512 is adamAVX2 on 16 lanes (AVX-512F), n a multiple of 16,
// bit for bit the same. Implemented in adam512_amd64.s.
//
//go:noescape
func adamAVX512(p, grad, m, v *float32, n int, k *AdamLanes, wd bool)

// adamVec is geluForwardVec for the Adam kernels of path.
func adamVec(p, g, m, v []float32, k *AdamLanes, wd bool, path Path) int {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	n16, n8 := rowRuns(len(p), path)
	if n16 > 0 {
		adamAVX512(&p[0], &g[0], &m[0], &v[0], n16, k, wd)
	}
	if n8 > n16 {
		adamAVX2(&p[n16], &g[n16], &m[n16], &v[n16], n8-n16, k, wd)
	}
	return n8
}
