package client_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"os"
	"slices"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// exampleServer starts an in-process server on a free loopback port that
// hosts the given uids as the built-in C ffn (a 4 KB module that compiles
// in milliseconds) at hidden_dim 4, with a one-node DHT when dht is set.
// stop shuts it down and removes its data dir.
func exampleServer(dht bool, uids ...string) (srv *host.Server, stop func()) {
	dir, err := os.MkdirTemp("", "moehost-example-")
	if err != nil {
		log.Fatal(err)
	}
	var experts []host.ExpertConfig
	for _, u := range uids {
		experts = append(experts, host.ExpertConfig{UID: u, Module: host.ModuleBytes(wasmexperts.FFNC), Config: map[string]int64{"hidden_dim": 4}})
	}
	opts := []host.Option{host.WithListen("127.0.0.1:*"), host.WithDataDir(dir), host.WithExperts(experts...)}
	if dht {
		opts = append(opts, host.WithDHT(host.DHTConfig{}))
	}
	srv, err = host.New(opts...)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return srv, func() {
		srv.Shutdown(context.Background())
		os.RemoveAll(dir)
	}
}

// waitFor returns what dir finds under prefix once it finds n uids: a
// server announces its experts as it starts, not before Start returns.
func waitFor(ctx context.Context, dir client.Directory, prefix string, n int) map[string][]client.Endpoint {
	for {
		found, err := dir.Discover(ctx, []string{prefix})
		if err == nil && len(found) == n {
			return found
		}
		if ctx.Err() != nil {
			log.Fatalf("%s: found %d uids (%v), want %d", prefix, len(found), err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A RemoteExpert calls one expert of one server by its address. The
// server here is in-process; any moehost server's address will do.
func ExampleRemoteExpert_Forward() {
	srv, stop := exampleServer(false, "ffn.0")
	defer stop()

	c := client.New(srv.Addr())
	defer c.Close()
	ffn := c.Expert("ffn.0")
	ctx := context.Background()

	info, err := ffn.Info(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, in := range info.GetInputs() {
		fmt.Println("input", in.GetName(), in.GetShape())
	}
	fmt.Println("parameters:", info.GetParameterCount())

	// A batch of two rows of hidden_dim 4.
	x := client.Float32([]int64{2, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	outs, err := ffn.Forward(ctx, x)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("outputs:", len(outs))
	fmt.Println("y:", outs[0].DType, outs[0].Shape)

	// A batch of the wrong width is refused by the expert's schema.
	_, err = ffn.Forward(ctx, client.Float32([]int64{1, 3}, []float32{1, 2, 3}))
	fmt.Println("bad width refused:", err != nil)
	// Output:
	// input x [-1 4]
	// parameters: 156
	// outputs: 1
	// y: float32 [2 4]
	// bad width refused: true
}

// A MixtureOfExperts sends each sample to the k experts of a grid that
// its gate scores rank highest, found by beam search, and mixes their
// outputs. Here the directory is the server's DiscoveryService, over a
// 2×2 grid on one server; a Swarm (the DHT itself) serves as well.
func ExampleMixtureOfExperts_Forward() {
	srv, stop := exampleServer(true, "ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1")
	defer stop()

	dir := client.NewDiscoveryClient(srv.Addr())
	defer dir.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(ctx, dir, "ffn.", 4)

	// scores[d][i] is the gate's score of coordinate i in grid dimension d.
	// An expert's score is the sum over its coordinates.
	sample0 := [][]float64{{2, 0}, {0, 1}} // ffn.0.1 = 3, ffn.0.0 = 2, ffn.1.1 = 1
	sample1 := [][]float64{{0, 4}, {1, 0}} // ffn.1.0 = 5, ffn.1.1 = 4, ffn.0.0 = 1

	// The beam search alone: the best two experts of sample 0, best first.
	best, err := dir.BeamSearch(ctx, "ffn", sample0, 2, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, ch := range best {
		fmt.Printf("%s score %.0f on %d server\n", ch.UID, ch.Score, len(ch.Endpoints))
	}

	moe, err := client.NewMixtureOfExperts(dir, client.MoEConfig{Prefix: "ffn", K: 2, KMin: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer moe.Close()
	x := client.Float32([]int64{2, 4}, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	out, err := moe.Forward(ctx, x, [][][]float64{sample0, sample1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("output:", out.Output.Shape)
	for b, uids := range out.Experts {
		// The experts are listed in the order they answered, each with its
		// weight: a softmax of the scores of those that answered.
		weight := map[string]float64{}
		for i, uid := range uids {
			weight[uid] = out.Weights[b][i]
		}
		fmt.Print("sample ", b, " mixed")
		for _, uid := range slices.Sorted(maps.Keys(weight)) {
			fmt.Printf(" %s×%.2f", uid, weight[uid])
		}
		fmt.Println()
	}
	// Output:
	// ffn.0.1 score 3 on 1 server
	// ffn.0.0 score 2 on 1 server
	// output: [2 4]
	// sample 0 mixed ffn.0.0×0.27 ffn.0.1×0.73
	// sample 1 mixed ffn.1.0×0.73 ffn.1.1×0.27
}

// A Swarm joins the DHT swarm as a client and finds every server that
// announces an expert, by uid or by grid prefix. Here the swarm is one
// in-process server's node.
func ExampleSwarm_Discover() {
	srv, stop := exampleServer(true, "ffn.0.0", "ffn.0.1", "ffn.1.0")
	defer stop()
	info, _ := srv.DHT()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sw, err := client.NewSwarm(ctx, info.Addrs, client.WithCacheTTL(0), client.WithNegativeTTL(0))
	if err != nil {
		log.Fatal(err)
	}
	defer sw.Close()

	found := waitFor(ctx, sw, "ffn.", 3)
	for _, uid := range slices.Sorted(maps.Keys(found)) {
		eps := found[uid]
		fmt.Printf("%s: %d endpoint, signed by the server %v, at its address %v\n",
			uid, len(eps), eps[0].PeerID == info.PeerID, eps[0].URL == "http://"+srv.Addr())
	}
	// Output:
	// ffn.0.0: 1 endpoint, signed by the server true, at its address true
	// ffn.0.1: 1 endpoint, signed by the server true, at its address true
	// ffn.1.0: 1 endpoint, signed by the server true, at its address true
}
