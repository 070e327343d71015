package dht_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/dht"
	"github.com/moehost/moehost/sdk/swarm"
)

type fakeExperts []dht.Expert

func (f fakeExperts) DHTExperts() []dht.Expert { return f }

// BenchmarkDHT measures, in a 32-node loopback swarm, the time for one
// server to announce 1,000 experts (ffn.0.0 … ffn.31.31, plus their grid
// prefixes), and the latency of looking one uid up from a client node
// that knows one peer. It reports announce_s, lookup_p50_ms and
// lookup_p99_ms.
func BenchmarkDHT(b *testing.B) {
	ctx := context.Background()
	var nodes []*swarm.Node
	for i := range 31 {
		cfg := swarm.Config{}
		if i > 0 {
			cfg.InitialPeers = nodes[0].Addrs()
		}
		n, err := swarm.NewNode(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}
	var experts fakeExperts
	for i := range 1000 {
		experts = append(experts, dht.Expert{UID: fmt.Sprintf("ffn.%d.%d", i/32, i%32), Digest: "sha256:00"})
	}
	svc, err := dht.New(ctx, dht.Config{DataDir: b.TempDir(), URLs: []string{"http://127.0.0.1:1"}, InitialPeers: nodes[7].Addrs(), UpdatePeriod: 10 * time.Minute}, experts)
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close(ctx)
	client, err := swarm.NewNode(ctx, swarm.Config{Client: true, InitialPeers: nodes[20].Addrs()})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	time.Sleep(time.Second) // let routing tables fill

	var announce time.Duration
	var lat []time.Duration
	r := rand.New(rand.NewPCG(1, 1))
	for b.Loop() {
		begin := time.Now()
		if err := svc.AnnounceOnce(ctx); err != nil {
			b.Fatal(err)
		}
		announce += time.Since(begin)
		for range 200 {
			uid := experts[r.IntN(len(experts))].UID
			t := time.Now()
			recs, err := client.Find(ctx, uid)
			lat = append(lat, time.Since(t))
			if err != nil || len(recs) != 1 {
				b.Fatalf("Find(%s) = %v, %v", uid, recs, err)
			}
		}
	}
	slices.Sort(lat)
	b.ReportMetric(announce.Seconds()/float64(b.N), "announce_s")
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "lookup_p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "lookup_p99_ms")
}
