// Package loadgen drives a moehost server with concurrent Forward calls
// and measures throughput and latency, for `moehost bench`.
package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/sdk/wire"

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
	// DType is the wire dtype of inputs and outputs: float32 (the zero
	// value), float16 or bfloat16.
	DType abi.DType
	// ServerCPU, when set, returns the server process's CPU time so far;
	// Run reads it at both ends of the measured window (ProcessCPU).
	ServerCPU func() (time.Duration, error)
}

// Result summarises a load.
type Result struct {
	Requests   int
	Rows       int
	Errors     int
	Elapsed    time.Duration
	P50, P99   time.Duration
	FirstError error
	// RequestBytes and ResponseBytes add up the message sizes of the
	// successful requests counted in Requests.
	RequestBytes, ResponseBytes int64
	// ServerCPU is the server's CPU time over the measured window, when
	// Config.ServerCPU was set, and ClientCPU this process's (the load
	// generator's, when the server is another process).
	ServerCPU, ClientCPU time.Duration
}

// ServerCPUPerRequest is the server's CPU time per completed request, 0
// when unknown.
func (r Result) ServerCPUPerRequest() time.Duration {
	if r.ServerCPU <= 0 || r.Requests == 0 {
		return 0
	}
	return r.ServerCPU / time.Duration(r.Requests)
}

// ClientCPUPerRequest is this process's CPU time per completed request, 0
// when unknown.
func (r Result) ClientCPUPerRequest() time.Duration {
	if r.ClientCPU <= 0 || r.Requests == 0 {
		return 0
	}
	return r.ClientCPU / time.Duration(r.Requests)
}

// BytesPerRequest is the mean size of a request and of a response message.
func (r Result) BytesPerRequest() (req, res float64) {
	n := float64(r.Requests - r.Errors)
	if n == 0 {
		return 0, 0
	}
	return float64(r.RequestBytes) / n, float64(r.ResponseBytes) / n
}

// RowsPerSecond is the throughput in examples.
func (r Result) RowsPerSecond() float64 { return float64(r.Rows) / r.Elapsed.Seconds() }

// RequestsPerSecond is the completed requests per second of the window.
func (r Result) RequestsPerSecond() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

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
	if cfg.ServerCPU != nil {
		wg.Go(func() {
			time.Sleep(time.Until(measureFrom))
			c0, err0 := cfg.ServerCPU()
			m0, merr0 := ProcessCPU(os.Getpid())
			time.Sleep(time.Until(stop))
			c1, err1 := cfg.ServerCPU()
			m1, merr1 := ProcessCPU(os.Getpid())
			mu.Lock()
			if err0 == nil && err1 == nil {
				res.ServerCPU = c1 - c0
			}
			if merr0 == nil && merr1 == nil {
				res.ClientCPU = m1 - m0
			}
			mu.Unlock()
		})
	}
	for c := range cfg.Clients {
		rng := rand.New(rand.NewPCG(uint64(c), 1))
		// Each request takes its rows from this block at a random
		// row: drawing 1,024 fresh normals a request cost the load
		// generator 25 µs of CPU a request, on the cores it shares
		// with the server it measures.
		block := normals(rng, (cfg.MaxRows+blockSlack)*cfg.Hidden)
		wg.Go(func() {
			for i := 0; ; i++ {
				now := time.Now()
				if now.After(stop) || ctx.Err() != nil {
					return
				}
				rows := cfg.MinRows + rng.IntN(cfg.MaxRows-cfg.MinRows+1)
				req := &moehostv1.ForwardRequest{
					Uid:         cfg.Experts[(c+i)%len(cfg.Experts)],
					Inputs:      []*moehostv1.Tensor{randomTensor(rng, block, rows, cfg.Hidden, cfg.DType)},
					OutputDtype: moehostv1.DType(cfg.DType),
				}
				out, err := client.Forward(ctx, connect.NewRequest(req))
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
					res.RequestBytes += int64(proto.Size(req))
					res.ResponseBytes += int64(proto.Size(out.Msg))
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

// blockSlack is how many rows a client's block of values has beyond the
// most a request takes, so that requests start at different rows.
const blockSlack = 16

// normals returns n normal random values.
func normals(rng *rand.Rand, n int) []float32 {
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(rng.NormFloat64())
	}
	return f
}

// randomTensor returns rows of block from a random row on, sent as dt
// (float32 when dt is not a 16-bit float).
func randomTensor(rng *rand.Rand, block []float32, rows, hidden int, dt abi.DType) *moehostv1.Tensor {
	shape := []int64{int64(rows), int64(hidden)}
	off := rng.IntN(len(block)/hidden-rows+1) * hidden
	return wire.Tensor(shape, block[off:off+rows*hidden], dt)
}

// Row formats a result as a table row.
func (r Result) Row(name string) string {
	req, res := r.BytesPerRequest()
	cpu := "–"
	if c := r.ServerCPUPerRequest(); c > 0 {
		cpu = fmt.Sprintf("%.0f", float64(c)/float64(time.Microsecond))
	}
	return fmt.Sprintf("| %-28s | %10.1f | %10.1f | %8d | %8.1f | %8.1f | %6d | %9.1f | %9.1f | %13s |", name, r.RowsPerSecond(),
		r.RequestsPerSecond(), r.Requests,
		float64(r.P50)/float64(time.Millisecond), float64(r.P99)/float64(time.Millisecond), r.Errors, req/1024, res/1024, cpu)
}

// Header is the table header for Row.
const Header = "| mode                         | samples/s  | requests/s | requests | p50 ms   | p99 ms   | errors | req KiB   | resp KiB  | server CPU µs/req |\n|---|---|---|---|---|---|---|---|---|---|"

// ProcessCPU returns the user and system CPU time of process pid so far,
// from /proc/pid/stat (Linux; in clock ticks of 1/100 s, the USER_HZ of
// every Linux architecture Go supports).
func ProcessCPU(pid int) (time.Duration, error) { return procCPU(pid, false) }

// ProcessTreeCPU is ProcessCPU plus the CPU time of the children pid has
// waited for (a server's compile children).
func ProcessTreeCPU(pid int) (time.Duration, error) { return procCPU(pid, true) }

func procCPU(pid int, children bool) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(pid, b, children)
}

// parseStatCPU returns utime+stime of a /proc/pid/stat line (fields 14
// and 15), and with children also cutime+cstime (16 and 17).
func parseStatCPU(pid int, b []byte, children bool) (time.Duration, error) {
	// The command name (field 2) may hold spaces; fields resume after
	// its closing parenthesis, at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	n := 2 // utime and stime, fields 14 and 15
	if children {
		n = 4 // and cutime and cstime, 16 and 17
	}
	if len(f) < 11+n {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name, want at least %d", pid, len(f), 11+n)
	}
	var ticks int64
	for _, t := range f[11 : 11+n] {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: CPU time %q: %w", pid, t, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100), nil
}
