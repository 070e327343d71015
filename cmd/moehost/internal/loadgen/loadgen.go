// Package loadgen drives a moehost server with concurrent Forward calls
// and measures throughput and latency, for `moehost bench`.
package loadgen

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// Config describes a load.
type Config struct {
	Addr     string        // host:port of the server
	Experts  []string      // uids, called round-robin by each client
	Hidden   int           // the experts' input width
	Clients  int           // concurrent callers
	MinRows  int           // rows per request, drawn uniformly
	MaxRows  int           //
	Duration time.Duration // measured time, after a warm-up of a quarter of it
}

// Result summarises a load.
type Result struct {
	Requests   int
	Rows       int
	Errors     int
	Elapsed    time.Duration
	P50, P99   time.Duration
	FirstError error
}

// RowsPerSecond is the throughput in examples.
func (r Result) RowsPerSecond() float64 { return float64(r.Rows) / r.Elapsed.Seconds() }

// Run sends the load and returns what it measured.
func Run(ctx context.Context, cfg Config) Result {
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Clients}
	defer tr.CloseIdleConnections()
	client := moehostv1connect.NewExpertServiceClient(&http.Client{Transport: tr}, "http://"+cfg.Addr)

	// A request counts when it completes inside the measured window,
	// whenever it started, so that slow regimes are measured too; at the
	// end of the window the requests in flight are cancelled.
	warmup := cfg.Duration / 4
	start := time.Now()
	measureFrom, stop := start.Add(warmup), start.Add(warmup+cfg.Duration)
	ctx, cancel := context.WithDeadline(ctx, stop)
	defer cancel()
	var (
		mu   sync.Mutex
		res  Result
		lats []time.Duration
		wg   sync.WaitGroup
	)
	for c := range cfg.Clients {
		rng := rand.New(rand.NewPCG(uint64(c), 1))
		wg.Go(func() {
			for i := 0; ; i++ {
				now := time.Now()
				if now.After(stop) || ctx.Err() != nil {
					return
				}
				rows := cfg.MinRows + rng.IntN(cfg.MaxRows-cfg.MinRows+1)
				req := &moehostv1.ForwardRequest{
					Uid:    cfg.Experts[(c+i)%len(cfg.Experts)],
					Inputs: []*moehostv1.Tensor{randomTensor(rng, rows, cfg.Hidden)},
				}
				_, err := client.Forward(ctx, connect.NewRequest(req))
				done := time.Now()
				// Deadline errors come from the end of the window
				// (the server sees the client's deadline too).
				code := connect.CodeOf(err)
				if done.Before(measureFrom) || ctx.Err() != nil || (err != nil && (code == connect.CodeDeadlineExceeded || code == connect.CodeCanceled)) {
					continue
				}
				mu.Lock()
				res.Requests++
				if err != nil {
					res.Errors++
					if res.FirstError == nil {
						res.FirstError = err
					}
				} else {
					res.Rows += rows
					lats = append(lats, done.Sub(now))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Elapsed = cfg.Duration
	if len(lats) > 0 {
		slices.Sort(lats)
		res.P50 = lats[(len(lats)-1)*50/100]
		res.P99 = lats[(len(lats)-1)*99/100]
	}
	return res
}

func randomTensor(rng *rand.Rand, rows, hidden int) *moehostv1.Tensor {
	data := make([]byte, 4*rows*hidden)
	for i := 0; i < rows*hidden; i++ {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(rng.NormFloat64())))
	}
	return &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{int64(rows), int64(hidden)}, Data: data}
}

// Row formats a result as a table row.
func (r Result) Row(name string) string {
	return fmt.Sprintf("| %-22s | %10.1f | %8d | %8.1f | %8.1f | %6d |", name, r.RowsPerSecond(), r.Requests,
		float64(r.P50)/float64(time.Millisecond), float64(r.P99)/float64(time.Millisecond), r.Errors)
}

// Header is the table header for Row.
const Header = "| mode                   | samples/s  | requests | p50 ms   | p99 ms   | errors |\n|---|---|---|---|---|---|"
