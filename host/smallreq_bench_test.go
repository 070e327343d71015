package host

import (
	"context"
	"net/http"
	"runtime"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// BenchmarkSmallRequest measures the request path alone: 32 concurrent
// callers send one-row Forward requests (hidden 1024, 4 KiB each way)
// over Connect on loopback to four nop experts, which hand their input
// back, so no kernel runs. allocs/op and B/op count the client's
// allocations too (it shares the process); make bench's 1-row line
// measures the server alone, from a child process.
func BenchmarkSmallRequest(b *testing.B) {
	const hidden = 1024
	uids := []string{"nop.0", "nop.1", "nop.2", "nop.3"}
	var experts []ExpertConfig
	for _, uid := range uids {
		experts = append(experts, ExpertConfig{UID: uid, Module: ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": hidden}})
	}
	srv := startTestServer(b, WithExperts(experts...), WithBatching(BatchLimits{QueueSize: 1 << 16}))
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := moehostv1connect.NewExpertServiceClient(&http.Client{Transport: tr}, "http://"+srv.Addr())
	x := tensor([]int64{1, hidden}, make([]float64, hidden))
	ctx := context.Background()
	// 32 callers on 2 cores, as make bench's 1-row line has.
	b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			req := &moehostv1.ForwardRequest{Uid: uids[i%len(uids)], Inputs: []*moehostv1.Tensor{x}}
			i++
			res, err := c.Forward(ctx, connect.NewRequest(req))
			if err != nil {
				b.Error(err)
				return
			}
			if len(res.Msg.GetOutputs()) != 1 || len(res.Msg.GetOutputs()[0].GetData()) != 4*hidden {
				b.Errorf("got %d outputs, want one of %d bytes", len(res.Msg.GetOutputs()), 4*hidden)
				return
			}
		}
	})
}
