package gpuhost_test

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// rowBench is one op of BenchmarkRowOps at a transformer's sizes; bytes
// is the memory an ideal kernel reads and writes once, for the GB/s
// metric.
type rowBench struct {
	name   string
	op     abi.Op
	shapes [][]int
	attrs  []float64
	ids    int // for an int32 ids arg 0 (embedding) or an int64 target arg 1
	bytes  float64
}

var rowBenches = []rowBench{
	{name: "layer_norm/4096x1024", op: abi.OpLayerNorm, shapes: [][]int{{4096, 1024}, {1024}, {1024}}, bytes: 2 * 4 * 4096 * 1024},
	{name: "rms_norm/4096x1024", op: abi.OpRMSNorm, shapes: [][]int{{4096, 1024}, {1024}}, bytes: 2 * 4 * 4096 * 1024},
	{name: "softmax/4096x1024", op: abi.OpSoftmax, shapes: [][]int{{4096, 1024}}, bytes: 2 * 4 * 4096 * 1024},
	{name: "softmax-experts/4096x8", op: abi.OpSoftmax, shapes: [][]int{{4096, 8}}, bytes: 2 * 4 * 4096 * 8},
	{name: "sum-axis0/4096x1024", op: abi.OpSum, shapes: [][]int{{4096, 1024}}, attrs: []float64{0}, bytes: 4 * 4096 * 1024},
	{name: "max/4096x1024", op: abi.OpMax, shapes: [][]int{{4096, 1024}}, bytes: 4 * 4096 * 1024},
	{name: "permute-heads/8x512x16x64", op: abi.OpPermute, shapes: [][]int{{8, 512, 16, 64}}, attrs: []float64{0, 2, 1, 3}, bytes: 2 * 4 * 8 * 512 * 16 * 64},
	{name: "embedding/4096x1024", op: abi.OpEmbedding, shapes: [][]int{{4096}, {32000, 1024}}, ids: 32000, bytes: 2 * 4 * 4096 * 1024},
	{name: "cross_entropy/1024x32000", op: abi.OpCrossEntropy, shapes: [][]int{{1024, 32000}, {1024}}, attrs: []float64{1}, ids: 32000, bytes: 4 * 1024 * 32000},
	{name: "attention/8x16x512x64", op: abi.OpAttention, shapes: [][]int{{8, 16, 512, 64}, {8, 16, 512, 64}, {8, 16, 512, 64}}, attrs: []float64{1}, bytes: 4 * (4*8*16*512*64 + 8*16*512*512)},
}

// rowBenchSkip names devices that BenchmarkRowOps skips, with why.
var rowBenchSkip = map[string]string{}

// BenchmarkRowOps runs the row and structured ops forward on the build
// devices (the CUDA device under -tags cuda) at a transformer's sizes,
// and reports GB/s against the memory an ideal kernel would touch. The
// CPU's devices are left out: these ops are not its bottleneck, and
// `make bench` runs every benchmark. A CUDA device's launches are
// asynchronous, so each run ends with a copy out, which waits for them.
func BenchmarkRowOps(b *testing.B) {
	for _, d := range buildDevices {
		for _, rb := range rowBenches {
			b.Run(d.name+"/"+rb.name, func(b *testing.B) {
				if why, ok := rowBenchSkip[d.name]; ok {
					b.Skip(why)
				}
				dev := d.dev
				rng := rand.New(rand.NewPCG(1, 2))
				args := make([]*gpuhost.Tensor, len(rb.shapes))
				for i, s := range rb.shapes {
					n := numel(s)
					var err error
					switch {
					case rb.op == abi.OpEmbedding && i == 0:
						buf := make([]byte, 4*n)
						for j := range n {
							binary.LittleEndian.PutUint32(buf[4*j:], uint32(rng.IntN(rb.ids)))
						}
						args[i], err = dev.FromBytes(abi.DTypeInt32, s, buf)
					case rb.op == abi.OpCrossEntropy && i == 1:
						buf := make([]byte, 8*n)
						for j := range n {
							binary.LittleEndian.PutUint64(buf[8*j:], uint64(rng.IntN(rb.ids)))
						}
						args[i], err = dev.FromBytes(abi.DTypeInt64, s, buf)
					default:
						args[i], err = dev.FromFloat32(s, to32(randVals(rng, n, -1, 1)))
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				one, err := dev.FromFloat32([]int{1}, []float32{0})
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					outs, err := gpuhost.ApplyMulti(dev, nil, rb.op, args, rb.attrs)
					if err != nil {
						b.Fatal(err)
					}
					dev.Release(outs...)
				}
				if _, err := dev.Float32s(one); err != nil { // waits for the queued work
					b.Fatal(err)
				}
				b.ReportMetric(rb.bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
