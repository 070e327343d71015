package host

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/internal/testing/ref"
)

// TestHammerBatching sends hundreds of concurrent Forward requests of
// random sizes, some larger than max_batch_size, to two experts and checks
// that each caller gets exactly its own rows back, in order, by comparing
// with the same request run alone.
func TestHammerBatching(t *testing.T) {
	const h, maxBatch, requests = 8, 32, 200
	srv := startTestServer(t,
		WithBatching(BatchLimits{MaxBatchSize: maxBatch, MinBatchSize: maxBatch, MaxWait: 10 * time.Millisecond, QueueSize: 4096}),
		WithExperts(
			ExpertConfig{UID: "a.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": h}},
			ExpertConfig{UID: "a.1", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": h}},
		),
	)
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	c := moehostv1connect.NewExpertServiceClient(hc, "http://"+srv.Addr())
	ctx := context.Background()

	type job struct {
		uid string
		x   []float64
		got []float32
		err error
	}
	rng := rand.New(rand.NewPCG(7, 8))
	jobs := make([]*job, requests)
	pieces := 0
	for i := range jobs {
		rows := 1 + rng.IntN(maxBatch+8)
		pieces += (rows + maxBatch - 1) / maxBatch
		jobs[i] = &job{uid: fmt.Sprintf("a.%d", i%2), x: randVec(rng, rows*h)}
	}
	forward := func(j *job) ([]float32, error) {
		res, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{
			Uid: j.uid, Inputs: []*moehostv1.Tensor{tensor([]int64{int64(len(j.x) / h), h}, j.x)},
		}))
		if err != nil {
			return nil, err
		}
		return floats(t, res.Msg.GetOutputs()[0]), nil
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() { j.got, j.err = forward(j) })
	}
	wg.Wait()
	batches := srv.expert("a.0").Info().GetForwardPool().GetBatches() + srv.expert("a.1").Info().GetForwardPool().GetBatches()
	for i, j := range jobs {
		if j.err != nil {
			t.Fatalf("request %d: %v", i, j.err)
		}
		alone, err := forward(j)
		if err != nil {
			t.Fatal(err)
		}
		if len(j.got) != len(alone) {
			t.Fatalf("request %d: %d values back, want %d", i, len(j.got), len(alone))
		}
		want := make([]float64, len(alone))
		for k, v := range alone {
			want[k] = float64(v)
		}
		if e := ref.RelErr(j.got, want); e > 1e-6 {
			t.Fatalf("request %d (%d rows): batched result differs from running it alone by %.3g", i, len(j.x)/h, e)
		}
	}
	if batches >= int64(pieces) {
		t.Errorf("%d requests (%d pieces) ran in %d batches: nothing was batched", requests, pieces, batches)
	}
	t.Logf("%d requests (%d pieces) ran in %d batches", requests, pieces, batches)
}

// startTestServer starts a server on a free port that shuts down with the
// test.
func startTestServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	// Each server has its own data dir, so that one test's checkpoints
	// and deployments never reach another's server (a failed deploy test
	// once left its experts to the next test); all share one
	// compilation cache (TestMain).
	opts = append([]Option{WithListen("127.0.0.1:*"), WithDataDir(t.TempDir())}, opts...)
	srv, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return srv
}
