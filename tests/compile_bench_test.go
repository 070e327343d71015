package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"path/filepath"
	"slices"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
)

// BenchmarkForwardDuringCompile measures what compiling an accepted module
// costs another tenant: alice calls her ffn back to back while mallory
// uploads the 1.9 MB Go ffn (new bytes each time, so each upload
// compiles), interleaved with windows of the same length in which nobody
// uploads. Both kinds of window run under the same machine load, so their
// latencies compare; the metrics are alice's p50, p99 and worst call in
// each, and the p99 the compile added.
func BenchmarkForwardDuringCompile(b *testing.B) {
	bin := buildMoehost(b, "")
	dir := b.TempDir()
	file := filepath.Join(dir, "tenants.json")
	alice := addTenant(b, bin, file, "alice", "alice")
	mallory := addTenant(b, bin, file, "mallory", "mallory")
	h := startTenantsHost(b, bin, dir, file)
	ctx := context.Background()
	want := h.deployAliceFFN(ctx, b, alice)

	// call runs alice's calls until stop says so, and returns their
	// latencies; a changed or failed answer fails the benchmark.
	call := func(stop func() bool) []time.Duration {
		var took []time.Duration
		for !stop() {
			start := time.Now()
			got, err := h.forward(ctx, alice, "alice.ffn.0")
			took = append(took, time.Since(start))
			if err != nil || !bytes.Equal(got, want) {
				b.Fatalf("alice's answer changed or failed: %v", err)
			}
		}
		return took
	}
	quietFor := func(d time.Duration) []time.Duration {
		end := time.Now().Add(d)
		return call(func() bool { return time.Now().After(end) })
	}
	compile := func(i int) ([]time.Duration, time.Duration) {
		// A custom section with a nonce makes the bytes, and so the
		// digest, new: the server compiles them again.
		nonce := binary.LittleEndian.AppendUint64([]byte{0x00, 10, 1, 'n'}, uint64(time.Now().UnixNano())+uint64(i))
		wasm := append(slices.Clone(wasmexperts.FFN), nonce...)
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := h.upload(ctx, mallory, wasm)
			done <- err
		}()
		var err error
		took := call(func() bool {
			select {
			case err = <-done:
				return true
			default:
				return false
			}
		})
		if err != nil {
			b.Fatalf("mallory's upload: %v", err)
		}
		return took, time.Since(start)
	}

	var quiet, compiling []time.Duration
	var compileTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Alternate which window comes first, so that neither always
		// follows the other's aftermath (a collection, the cache write).
		c, d := compile(i)
		if i%2 == 1 {
			quiet = append(quiet, quietFor(d)...)
			compiling = append(compiling, c...)
		} else {
			compiling = append(compiling, c...)
			quiet = append(quiet, quietFor(d)...)
		}
		compileTime += d
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	q50, q99, qmax := percentiles(quiet)
	c50, c99, cmax := percentiles(compiling)
	b.ReportMetric(ms(compileTime)/float64(b.N), "upload-ms/op")
	b.ReportMetric(ms(q50), "quiet-p50-ms")
	b.ReportMetric(ms(q99), "quiet-p99-ms")
	b.ReportMetric(ms(qmax), "quiet-max-ms")
	b.ReportMetric(ms(c50), "compiling-p50-ms")
	b.ReportMetric(ms(c99), "compiling-p99-ms")
	b.ReportMetric(ms(cmax), "compiling-max-ms")
	b.ReportMetric(ms(c99-q99), "added-p99-ms")
	b.Logf("alice's calls: %d quiet, %d during %d compiles", len(quiet), len(compiling), b.N)
}

// percentiles returns the median, the 99th percentile and the largest of
// ds, which it sorts.
func percentiles(ds []time.Duration) (p50, p99, maxd time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
}
