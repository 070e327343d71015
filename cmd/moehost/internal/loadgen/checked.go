package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/wire"
)

// Checked is a load whose every response is checked: its dtype and
// shape, finite values, and in Forward-only loads, the output of a probe
// row that each request carries at a random place against the probe's
// output alone, which catches rows mixed up between requests or stale
// storage. With Backward set, each step is a Forward and then a Backward
// of the same rows with random output gradients, as a trainer sends.
type Checked struct {
	Addr     string
	Experts  []string
	Hidden   int
	Clients  int
	MinRows  int
	MaxRows  int
	Backward bool
}

// Checker holds a Checked load's clients and probe outputs, so that the
// load can run in several stretches.
type Checker struct {
	cfg    Checked
	tr     *http.Transport
	client moehostv1connect.ExpertServiceClient
	probe  []float32
	want   map[string][]float32 // the probe's output per expert
	round  int
}

// NewChecker connects to cfg.Addr and computes each expert's output of
// the probe row.
func NewChecker(ctx context.Context, cfg Checked) (*Checker, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Clients}
	c := &Checker{
		cfg:    cfg,
		tr:     tr,
		client: moehostv1connect.NewExpertServiceClient(&http.Client{Transport: tr}, "http://"+cfg.Addr),
		want:   map[string][]float32{},
	}
	rng := rand.New(rand.NewPCG(15, 15))
	c.probe = make([]float32, cfg.Hidden)
	for i := range c.probe {
		c.probe[i] = float32(rng.NormFloat64())
	}
	if !cfg.Backward {
		for _, uid := range cfg.Experts {
			res, err := c.client.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{
				Uid: uid, Inputs: []*moehostv1.Tensor{f32Tensor(1, cfg.Hidden, c.probe)},
			}))
			if err != nil {
				return nil, fmt.Errorf("probe of %s: %w", uid, err)
			}
			out, err := checkTensor(res.Msg.GetOutputs(), 1, cfg.Hidden)
			if err != nil {
				return nil, fmt.Errorf("probe of %s: %w", uid, err)
			}
			c.want[uid] = out
		}
	}
	return c, nil
}

// Close closes the idle connections.
func (c *Checker) Close() { c.tr.CloseIdleConnections() }

// Run sends the load for d and returns what it measured. Rows count the
// samples of completed steps; a step that fails a check counts as an
// error, and so does every RPC error.
func (c *Checker) Run(ctx context.Context, d time.Duration) Result {
	cfg := c.cfg
	c.round++
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var (
		mu  sync.Mutex
		res Result
		wg  sync.WaitGroup
	)
	for cl := range cfg.Clients {
		rng := rand.New(rand.NewPCG(uint64(cl), uint64(c.round)))
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				uid := cfg.Experts[(cl+i)%len(cfg.Experts)]
				rows := cfg.MinRows + rng.IntN(cfg.MaxRows-cfg.MinRows+1)
				err := c.step(ctx, rng, uid, rows)
				// The server sees the stretch's deadline too, and may
				// answer DeadlineExceeded just before the client's
				// context ends: the end of the stretch, not a failure.
				if code := connect.CodeOf(err); ctx.Err() != nil || (err != nil && (code == connect.CodeDeadlineExceeded || code == connect.CodeCanceled)) {
					return
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
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res
}

// step sends one request (or a Forward and a Backward) and checks the
// answers.
func (c *Checker) step(ctx context.Context, rng *rand.Rand, uid string, rows int) error {
	h := c.cfg.Hidden
	x := make([]float32, rows*h)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	at := rng.IntN(rows)
	want := c.want[uid]
	if want != nil {
		copy(x[at*h:], c.probe)
	}
	in := []*moehostv1.Tensor{f32Tensor(rows, h, x)}
	fres, err := c.client.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: uid, Inputs: in}))
	if err != nil {
		return fmt.Errorf("forward of %d rows to %s: %w", rows, uid, err)
	}
	out, err := checkTensor(fres.Msg.GetOutputs(), rows, h)
	if err != nil {
		return fmt.Errorf("forward of %d rows to %s: %w", rows, uid, err)
	}
	for j, w := range want {
		if g := out[at*h+j]; math.Abs(float64(g-w)) > 1e-4*(1+math.Abs(float64(w))) {
			return fmt.Errorf("forward of %d rows to %s: the probe at row %d gives %g at column %d, alone %g", rows, uid, at, g, j, w)
		}
	}
	if !c.cfg.Backward {
		return nil
	}
	gy := make([]float32, rows*h)
	for i := range gy {
		gy[i] = float32(rng.NormFloat64())
	}
	bres, err := c.client.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{
		Uid: uid, Inputs: in, GradOutputs: []*moehostv1.Tensor{f32Tensor(rows, h, gy)},
	}))
	if err != nil {
		return fmt.Errorf("backward of %d rows to %s: %w", rows, uid, err)
	}
	if _, err := checkTensor(bres.Msg.GetGradInputs(), rows, h); err != nil {
		return fmt.Errorf("backward of %d rows to %s: %w", rows, uid, err)
	}
	return nil
}

// checkTensor checks that ts is one finite float32 [rows, h] tensor and
// returns its values.
func checkTensor(ts []*moehostv1.Tensor, rows, h int) ([]float32, error) {
	if len(ts) != 1 {
		return nil, fmt.Errorf("%d tensors in the answer, want 1", len(ts))
	}
	t := ts[0]
	if t.GetDtype() != moehostv1.DType_DTYPE_FLOAT32 || len(t.GetShape()) != 2 || t.GetShape()[0] != int64(rows) || t.GetShape()[1] != int64(h) || len(t.GetData()) != 4*rows*h {
		return nil, fmt.Errorf("answer is %v%v with %d bytes, want float32[%d %d]", t.GetDtype(), t.GetShape(), len(t.GetData()), rows, h)
	}
	out, err := wire.Values(t)
	if err != nil {
		return nil, err
	}
	for _, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, errors.New("answer has a value that is not finite")
		}
	}
	return out, nil
}

func f32Tensor(rows, h int, v []float32) *moehostv1.Tensor {
	return wire.Tensor([]int64{int64(rows), int64(h)}, v, abi.DTypeFloat32)
}
