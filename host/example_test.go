package host_test

import (
	"context"
	"fmt"
	"log"
	"math"
	"os"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// Start a server with one ffn expert on a free port, call it with the Go
// client, and shut it down.
func Example() {
	dataDir, err := os.MkdirTemp("", "moehost-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dataDir)

	srv, err := host.New(
		host.WithListen("127.0.0.1:*"),
		host.WithDataDir(dataDir),
		host.WithExperts(host.ExpertConfig{
			UID:    "ffn.0",
			Module: host.ModuleBytes(wasmexperts.FFN),
			Config: map[string]int64{"hidden_dim": 16},
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)

	x := make([]float32, 2*16)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	c := client.New(srv.Addr())
	defer c.Close()
	out, err := c.Expert("ffn.0").Forward(ctx, client.Float32([]int64{2, 16}, x))
	if err != nil {
		log.Fatal(err)
	}
	y, _ := out[0].Float32s()
	fmt.Println("output shape:", out[0].Shape)
	// The ffn ends in a fresh LayerNorm, so every row has mean 0 and
	// standard deviation 1.
	for r := range 2 {
		var mean, sq float64
		for _, v := range y[16*r : 16*(r+1)] {
			mean += float64(v) / 16
			sq += float64(v) * float64(v) / 16
		}
		fmt.Printf("row %d: mean %.3f std %.3f\n", r, math.Abs(mean), math.Sqrt(sq-mean*mean))
	}
	// Output:
	// output shape: [2 16]
	// row 0: mean 0.000 std 1.000
	// row 1: mean 0.000 std 1.000
}
