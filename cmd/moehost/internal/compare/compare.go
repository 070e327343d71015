// Package compare measures hivemind's ffn expert on moehost against PyTorch
// eager on the same CPU, for `moehost bench --compare` (make bench-compare).
//
// It runs three sides in rounds, one side at a time so that they never share
// the cores: PyTorch eager in-process (scripts/bench_torch_ffn.py, kept
// running in a child process so that torch is imported once), moehost
// in-process (a server's own Forward and Backward, host.Server's call
// API: pools, batching, device worker, sandbox, tape and optimizer, without
// the wire), and moehost over RPC (a real server on loopback,
// Connect protocol, one request of the whole batch at a time). Each side
// measures forward and forward+backward+Adam. Rounds alternate the sides,
// so that drift from other load hits them all; the table shows each side's
// best round, and the spread of the ratios over the rounds.
package compare

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host"
)

// Config describes a comparison.
type Config struct {
	Module  []byte        // the ffn expert's wasm
	Hidden  int           // hidden_dim, 1024
	Batch   int           // rows per batch, 256
	Threads int           // torch.set_num_threads and moehost's GOMAXPROCS
	Rounds  int           // measurement rounds per side
	Measure time.Duration // measured time per mode and round
	Python  string        // python3
	Script  string        // scripts/bench_torch_ffn.py; empty skips torch
	DataDir string        // server data dir (compilation cache)
	// MinTorchGFLOPS is the least GFLOP/s torch's GEMM must reach for
	// the comparison to run: below it, torch is on the reference BLAS
	// and the comparison would flatter moehost.
	MinTorchGFLOPS float64
	// HostOptions are added to the moehost side's server's (the devices'
	// options from the environment).
	HostOptions []host.Option
}

// Rates are one round's samples/s of a side.
type Rates struct{ Fwd, FwdBwd float64 }

// Result holds every round of every side.
type Result struct {
	// Torch is PyTorch eager, TorchScript torch.jit.script of the same
	// block.
	Torch, TorchScript, InProc, RPC []Rates
	TorchVersion                    string
	TorchGEMM                       float64 // GFLOP/s of torch's 1024² float32 GEMM
	TorchBLAS                       string  // the BLAS and kernel that GEMM ran on
}

// Run measures cfg.Rounds rounds. progress, when not nil, gets a line per
// round.
func Run(ctx context.Context, cfg Config, progress io.Writer) (Result, error) {
	var res Result
	if progress == nil {
		progress = io.Discard
	}
	var torch *torchProc
	if cfg.Script != "" {
		var err error
		if torch, err = startTorch(ctx, cfg); err != nil {
			return res, err
		}
		defer torch.close()
		res.TorchVersion, res.TorchGEMM, res.TorchBLAS = torch.version, torch.gemm, torch.blas
		fmt.Fprintf(progress, "torch %s GEMM (1024², float32): %.1f GFLOP/s on %s\n", torch.version, torch.gemm, torch.blas)
		if torch.gemm < cfg.MinTorchGFLOPS {
			return res, fmt.Errorf("torch's GEMM runs at %.1f GFLOP/s, below the floor of %.0f: torch is on a slow BLAS (install libopenblas0-pthread), and the comparison would flatter moehost", torch.gemm, cfg.MinTorchGFLOPS)
		}
	}
	local, err := newInProc(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer local.close(ctx)
	remote, err := newRemote(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer remote.close(ctx)

	for r := range cfg.Rounds {
		if torch != nil {
			t, ts, err := torch.round(cfg.Measure)
			if err != nil {
				return res, err
			}
			res.Torch = append(res.Torch, t)
			res.TorchScript = append(res.TorchScript, ts)
			fmt.Fprintf(progress, "round %d torch     fwd %7.0f  fwd+bwd+adam %7.0f samples/s\n", r+1, t.Fwd, t.FwdBwd)
			fmt.Fprintf(progress, "round %d scripted  fwd %7.0f  fwd+bwd+adam %7.0f samples/s\n", r+1, ts.Fwd, ts.FwdBwd)
		}
		l, err := local.round(ctx, cfg)
		if err != nil {
			return res, fmt.Errorf("in-process: %w", err)
		}
		res.InProc = append(res.InProc, l)
		fmt.Fprintf(progress, "round %d in-proc   fwd %7.0f  fwd+bwd+adam %7.0f samples/s\n", r+1, l.Fwd, l.FwdBwd)
		m, err := remote.round(ctx, cfg)
		if err != nil {
			return res, fmt.Errorf("rpc: %w", err)
		}
		res.RPC = append(res.RPC, m)
		fmt.Fprintf(progress, "round %d rpc       fwd %7.0f  fwd+bwd+adam %7.0f samples/s\n", r+1, m.Fwd, m.FwdBwd)
	}
	return res, nil
}

// rate runs step for at least d after one warm-up call and returns
// samples/s.
func rate(ctx context.Context, batch int, d time.Duration, step func() error) (float64, error) {
	if err := step(); err != nil {
		return 0, err
	}
	n, start := 0, time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := step(); err != nil {
			return 0, err
		}
		n++
		if el := time.Since(start); el >= d && n >= 3 {
			return float64(n*batch) / el.Seconds(), nil
		}
	}
}

// inProc is a server's expert called within the process (host's Forward
// and Backward): the pools, batching, device worker, sandbox, tape and
// optimizer that an RPC reaches, without the wire.
type inProc struct {
	srv   *host.Server
	dev   gpuhost.Device
	x, gy []float32
}

func newInProc(ctx context.Context, cfg Config) (*inProc, error) {
	srv, err := startServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	return &inProc{srv: srv, dev: srv.Device(),
		x: randVec(rng, cfg.Batch*cfg.Hidden), gy: randVec(rng, cfg.Batch*cfg.Hidden)}, nil
}

func (p *inProc) close(ctx context.Context) { stopServer(ctx, p.srv) }

// Forward runs one forward request, as the RPC handler does after
// decoding, and releases what it made as the handler does after encoding.
func (p *inProc) Forward(ctx context.Context, shape []int) error {
	x, err := p.dev.FromFloat32(shape, p.x)
	if err != nil {
		return err
	}
	outs, err := p.srv.Forward(ctx, "ffn.0", []*gpuhost.Tensor{x})
	if err != nil {
		return err
	}
	p.dev.Release(append(outs, x)...)
	return nil
}

// Backward runs one backward request: the tape, the gradients and the
// server's Adam step.
func (p *inProc) Backward(ctx context.Context, shape []int) error {
	x, err := p.dev.FromFloat32(shape, p.x)
	if err != nil {
		return err
	}
	gy, err := p.dev.FromFloat32(shape, p.gy)
	if err != nil {
		return err
	}
	grads, err := p.srv.Backward(ctx, "ffn.0", []*gpuhost.Tensor{x}, []*gpuhost.Tensor{gy})
	if err != nil {
		return err
	}
	p.dev.Release(append(grads, x, gy)...)
	return nil
}

func (p *inProc) round(ctx context.Context, cfg Config) (Rates, error) {
	shape := []int{cfg.Batch, cfg.Hidden}
	var r Rates
	var err error
	if r.Fwd, err = rate(ctx, cfg.Batch, cfg.Measure, func() error { return p.Forward(ctx, shape) }); err != nil {
		return r, err
	}
	r.FwdBwd, err = rate(ctx, cfg.Batch, cfg.Measure, func() error { return p.Backward(ctx, shape) })
	return r, err
}

// startServer starts a server on loopback with the ffn expert "ffn.0" and
// Adam, as both moehost sides measure it.
func startServer(ctx context.Context, cfg Config) (*host.Server, error) {
	srv, err := host.New(append([]host.Option{
		host.WithListen("127.0.0.1:*"),
		host.WithDataDir(cfg.DataDir),
		host.WithExperts(host.ExpertConfig{UID: "ffn.0", Module: host.ModuleBytes(cfg.Module), Config: map[string]int64{"hidden_dim": int64(cfg.Hidden)}}),
		host.WithOptimizer(host.OptimizerConfig{Name: "adam"}),
		host.WithMaxRequestBytes(64 << 20),
	}, cfg.HostOptions...)...)
	if err != nil {
		return nil, err
	}
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	return srv, nil
}

func stopServer(ctx context.Context, srv *host.Server) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	srv.Shutdown(sctx)
}

// remote is a server on loopback and a Connect client.
type remote struct {
	srv    *host.Server
	tr     *http.Transport
	client moehostv1connect.ExpertServiceClient
	fwd    *moehostv1.ForwardRequest
	bwd    *moehostv1.BackwardRequest
}

func newRemote(ctx context.Context, cfg Config) (*remote, error) {
	srv, err := startServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	rng := rand.New(rand.NewPCG(3, 4))
	x := wireTensor(randVec(rng, cfg.Batch*cfg.Hidden), cfg.Batch, cfg.Hidden)
	gy := wireTensor(randVec(rng, cfg.Batch*cfg.Hidden), cfg.Batch, cfg.Hidden)
	return &remote{
		srv:    srv,
		tr:     tr,
		client: moehostv1connect.NewExpertServiceClient(&http.Client{Transport: tr}, "http://"+srv.Addr()),
		fwd:    &moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}},
		bwd:    &moehostv1.BackwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{x}, GradOutputs: []*moehostv1.Tensor{gy}},
	}, nil
}

func (r *remote) close(ctx context.Context) {
	r.tr.CloseIdleConnections()
	stopServer(ctx, r.srv)
}

func (r *remote) round(ctx context.Context, cfg Config) (Rates, error) {
	var out Rates
	var err error
	out.Fwd, err = rate(ctx, cfg.Batch, cfg.Measure, func() error {
		res, err := r.client.Forward(ctx, connect.NewRequest(r.fwd))
		if err == nil && len(res.Msg.GetOutputs()) != 1 {
			err = errors.New("forward: want one output")
		}
		return err
	})
	if err != nil {
		return out, err
	}
	out.FwdBwd, err = rate(ctx, cfg.Batch, cfg.Measure, func() error {
		res, err := r.client.Backward(ctx, connect.NewRequest(r.bwd))
		if err == nil && len(res.Msg.GetGradInputs()) != 1 {
			err = errors.New("backward: want one grad input")
		}
		return err
	})
	return out, err
}

// torchProc is the PyTorch script in its line mode.
type torchProc struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Scanner
	version string
	gemm    float64 // GFLOP/s
	blas    string  // the BLAS torch's GEMM ran on, and its kernel
}

func startTorch(ctx context.Context, cfg Config) (*torchProc, error) {
	cmd := exec.CommandContext(ctx, cfg.Python, cfg.Script,
		"--hidden", fmt.Sprint(cfg.Hidden), "--batch", fmt.Sprint(cfg.Batch), "--threads", fmt.Sprint(cfg.Threads))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s %s: %w", cfg.Python, cfg.Script, err)
	}
	p := &torchProc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	var hello struct {
		Ready bool    `json:"ready"`
		Torch string  `json:"torch"`
		GEMM  float64 `json:"gemm_gflops"`
		BLAS  string  `json:"blas"`
	}
	if err := p.read(&hello); err != nil || !hello.Ready {
		p.close()
		return nil, fmt.Errorf("torch script did not start: %v", err)
	}
	p.version, p.gemm, p.blas = hello.Torch, hello.GEMM, hello.BLAS
	return p, nil
}

func (p *torchProc) read(v any) error {
	if !p.out.Scan() {
		if err := p.out.Err(); err != nil {
			return err
		}
		return io.ErrUnexpectedEOF
	}
	return json.Unmarshal(p.out.Bytes(), v)
}

// round measures one round of eager and scripted PyTorch.
func (p *torchProc) round(d time.Duration) (eager, scripted Rates, err error) {
	if _, err := fmt.Fprintf(p.in, "round %g\n", d.Seconds()); err != nil {
		return eager, scripted, fmt.Errorf("torch: %w", err)
	}
	var r struct {
		Fwd          float64 `json:"fwd"`
		FwdBwd       float64 `json:"fwdbwd"`
		ScriptFwd    float64 `json:"script_fwd"`
		ScriptFwdBwd float64 `json:"script_fwdbwd"`
	}
	if err := p.read(&r); err != nil {
		return eager, scripted, fmt.Errorf("torch: %w", err)
	}
	return Rates{Fwd: r.Fwd, FwdBwd: r.FwdBwd}, Rates{Fwd: r.ScriptFwd, FwdBwd: r.ScriptFwdBwd}, nil
}

func (p *torchProc) close() {
	p.in.Close()
	p.cmd.Wait()
}

// Table renders the result: each side's best round, and the ratios to
// PyTorch eager's and scripted's best, with the range over the rounds
// against eager (round i of a side against round i of PyTorch).
func (res Result) Table() string {
	best := func(rs []Rates, f func(Rates) float64) float64 {
		b := 0.0
		for _, r := range rs {
			b = max(b, f(r))
		}
		return b
	}
	spread := func(rs []Rates, f func(Rates) float64) string {
		var q []float64
		for i, r := range rs {
			if i < len(res.Torch) && f(res.Torch[i]) > 0 {
				q = append(q, f(r)/f(res.Torch[i]))
			}
		}
		if len(q) == 0 {
			return ""
		}
		return fmt.Sprintf(" (%.2f–%.2f)", slices.Min(q), slices.Max(q))
	}
	ratio := func(rs, base []Rates, f func(Rates) float64) string {
		t := best(base, f)
		if t == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", best(rs, f)/t)
	}
	fwd := func(r Rates) float64 { return r.Fwd }
	bwd := func(r Rates) float64 { return r.FwdBwd }
	s := "| side | fwd samples/s | × eager (per round) | × scripted | fwd+bwd+Adam samples/s | × eager (per round) | × scripted |\n|---|---|---|---|---|---|---|\n"
	row := func(name string, rs []Rates) {
		if len(rs) == 0 {
			return
		}
		s += fmt.Sprintf("| %s | %.0f | %s%s | %s | %.0f | %s%s | %s |\n", name,
			best(rs, fwd), ratio(rs, res.Torch, fwd), spread(rs, fwd), ratio(rs, res.TorchScript, fwd),
			best(rs, bwd), ratio(rs, res.Torch, bwd), spread(rs, bwd), ratio(rs, res.TorchScript, bwd))
	}
	if len(res.Torch) > 0 {
		row(fmt.Sprintf("PyTorch eager %s (in-process; GEMM %.0f GFLOP/s on %s)", res.TorchVersion, res.TorchGEMM, res.TorchBLAS), res.Torch)
		row("PyTorch torch.jit.script (in-process)", res.TorchScript)
	}
	row("moehost in-process", res.InProc)
	row("moehost over RPC (Connect, loopback)", res.RPC)
	return s + fmt.Sprintf("\n%d rounds per side; a round measures each mode for the same time.\n", max(len(res.Torch), len(res.InProc)))
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func wireTensor(v []float32, rows, cols int) *moehostv1.Tensor {
	data := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(f))
	}
	return &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{int64(rows), int64(cols)}, Data: data}
}
