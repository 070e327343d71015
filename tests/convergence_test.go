package tests

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// The convergence task: a mixture of 4 ffn experts (hidden 8) with a fixed
// local softmax gate learns a teacher, t = tanh(x·A), by MSE.
const (
	convDim     = 8
	convExperts = 4
	convBatch   = 32
	convSteps   = 120
	convLR      = 0.01
)

// moeExpert is one expert of the mixture: remote or in-process.
type moeExpert interface {
	forward(x []float32) ([]float32, error)
	// backward trains on x with output gradient gy (one optimizer step).
	backward(x, gy []float32) error
}

type remoteExpert struct{ e *client.RemoteExpert }

func (r remoteExpert) forward(x []float32) ([]float32, error) {
	out, err := r.e.Forward(context.Background(), client.Float32([]int64{int64(len(x) / convDim), convDim}, x))
	if err != nil {
		return nil, err
	}
	return out[0].Float32s()
}

func (r remoteExpert) backward(x, gy []float32) error {
	shape := []int64{int64(len(x) / convDim), convDim}
	_, err := r.e.Backward(context.Background(), []client.Tensor{client.Float32(shape, x)}, []client.Tensor{client.Float32(shape, gy)})
	return err
}

// localExpert runs the same module in this process, through an in-process
// host.Server without the wire: the guest's forward on the tape, the tape
// backward, one Adam step.
type localExpert struct {
	srv *host.Server
	uid string
}

func (l *localExpert) forward(x []float32) ([]float32, error) {
	dev := l.srv.Device()
	xt, err := dev.FromFloat32([]int{len(x) / convDim, convDim}, x)
	if err != nil {
		return nil, err
	}
	defer dev.Release(xt)
	outs, err := l.srv.Forward(context.Background(), l.uid, []*gpuhost.Tensor{xt})
	if err != nil {
		return nil, err
	}
	defer dev.Release(outs...)
	return dev.Float32s(outs[0])
}

func (l *localExpert) backward(x, gy []float32) error {
	dev := l.srv.Device()
	shape := []int{len(x) / convDim, convDim}
	xt, err := dev.FromFloat32(shape, x)
	if err != nil {
		return err
	}
	defer dev.Release(xt)
	gt, err := dev.FromFloat32(shape, gy)
	if err != nil {
		return err
	}
	defer dev.Release(gt)
	grads, err := l.srv.Backward(context.Background(), l.uid, []*gpuhost.Tensor{xt}, []*gpuhost.Tensor{gt})
	if err != nil {
		return err
	}
	dev.Release(grads...)
	return nil
}

// moeTask holds the data and the fixed gate and teacher.
type moeTask struct {
	gate, teacher []float64 // [dim, experts], [dim, dim]
	batches       [][]float32
	eval          []float32
}

func newMoETask() *moeTask {
	rng := rand.New(rand.NewPCG(42, 42))
	t := &moeTask{}
	for range convDim * convExperts {
		t.gate = append(t.gate, rng.NormFloat64())
	}
	for range convDim * convDim {
		t.teacher = append(t.teacher, rng.NormFloat64()/math.Sqrt(convDim))
	}
	sample := func(n int) []float32 {
		x := make([]float32, n*convDim)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	for range convSteps {
		t.batches = append(t.batches, sample(convBatch))
	}
	t.eval = sample(256)
	return t
}

// gates returns softmax(x·gate) per row.
func (t *moeTask) gates(x []float32) [][]float64 {
	rows := len(x) / convDim
	g := make([][]float64, rows)
	for r := range rows {
		logits := make([]float64, convExperts)
		for k := range convExperts {
			for j := range convDim {
				logits[k] += float64(x[r*convDim+j]) * t.gate[j*convExperts+k]
			}
		}
		mx := slicesMax(logits)
		var z float64
		for k := range logits {
			logits[k] = math.Exp(logits[k] - mx)
			z += logits[k]
		}
		for k := range logits {
			logits[k] /= z
		}
		g[r] = logits
	}
	return g
}

func slicesMax(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

func (t *moeTask) target(x []float32) []float64 {
	rows := len(x) / convDim
	out := make([]float64, rows*convDim)
	for r := range rows {
		for i := range convDim {
			var s float64
			for j := range convDim {
				s += float64(x[r*convDim+j]) * t.teacher[j*convDim+i]
			}
			out[r*convDim+i] = math.Tanh(s)
		}
	}
	return out
}

// step runs the mixture on x, returns the MSE, and trains each expert
// once when train is set.
func (t *moeTask) step(experts []moeExpert, x []float32, train bool) (float64, error) {
	g := t.gates(x)
	tgt := t.target(x)
	outs := make([][]float32, len(experts))
	for k, e := range experts {
		var err error
		if outs[k], err = e.forward(x); err != nil {
			return 0, fmt.Errorf("expert %d forward: %w", k, err)
		}
	}
	n := float64(len(tgt))
	dy := make([]float64, len(tgt))
	var loss float64
	for i := range tgt {
		r := i / convDim
		var y float64
		for k := range experts {
			y += g[r][k] * float64(outs[k][i])
		}
		d := y - tgt[i]
		loss += d * d / n
		dy[i] = 2 * d / n
	}
	if !train {
		return loss, nil
	}
	for k, e := range experts {
		gy := make([]float32, len(dy))
		for i := range dy {
			gy[i] = float32(g[i/convDim][k] * dy[i])
		}
		if err := e.backward(x, gy); err != nil {
			return 0, fmt.Errorf("expert %d backward: %w", k, err)
		}
	}
	return loss, nil
}

// train runs every batch and returns the first and last training losses
// and the final loss on the held-out batch.
func (t *moeTask) train(experts []moeExpert) (first, last, eval float64, err error) {
	for i, x := range t.batches {
		l, err := t.step(experts, x, true)
		if err != nil {
			return 0, 0, 0, err
		}
		if i == 0 {
			first = l
		}
		last = l
	}
	eval, err = t.step(experts, t.eval, false)
	return first, last, eval, err
}

// TestConvergenceOverRPC trains a mixture of 4 ffn experts spread over two
// `moehost serve` processes through sdk/client, and the same mixture in
// this process, with the same seeds and batches. The remote run must end
// within 2% of the local one, and both must have learned.
func TestConvergenceOverRPC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := buildMoehost(t, dir)
	uids := make([]string, convExperts)
	for k := range uids {
		uids[k] = fmt.Sprintf("ffn.%d", k)
	}
	// One data dir for both servers and this process, started one after
	// the other, so that the module is compiled once and then cached.
	data := filepath.Join(dir, "data")
	var remote []moeExpert
	for i, pattern := range []string{"ffn.[0:2]", "ffn.[2:4]"} {
		cmd, addr := startServe(t, bin, "--data-dir", data, "--experts", pattern,
			"--hidden-dim", fmt.Sprint(convDim), "--optimizer", "adam", "--lr", fmt.Sprint(convLR), "--no-checkpoints", "--max-wait", "0s")
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		c := client.New(addr)
		defer c.Close()
		for k := 2 * i; k < 2*i+2; k++ {
			remote = append(remote, remoteExpert{c.Expert(uids[k])})
		}
	}

	// The local mixture: the same module in an in-process server, seeded
	// by the same uids as the remote experts.
	ctx := context.Background()
	var ecs []host.ExpertConfig
	for _, uid := range uids {
		ecs = append(ecs, host.ExpertConfig{UID: uid, Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": convDim}})
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(filepath.Join(dir, "local")), host.WithoutDHT(),
		host.WithExperts(ecs...), host.WithOptimizer(host.OptimizerConfig{Name: "adam", LR: convLR}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	var local []moeExpert
	for _, uid := range uids {
		local = append(local, &localExpert{srv: srv, uid: uid})
	}

	task := newMoETask()
	rFirst, rLast, rEval, err := task.train(remote)
	if err != nil {
		t.Fatal(err)
	}
	lFirst, lLast, lEval, err := task.train(local)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("remote: training loss %.7f → %.7f, held-out %.7f", rFirst, rLast, rEval)
	t.Logf("local:  training loss %.7f → %.7f, held-out %.7f", lFirst, lLast, lEval)
	if rel := math.Abs(rEval-lEval) / lEval; rel > 0.02 {
		t.Errorf("remote held-out loss %.5f is %.1f%% from the local %.5f; want within 2%%", rEval, 100*rel, lEval)
	}
	// Learning: the held-out loss is under a third of the first batch's.
	for _, r := range []struct {
		name         string
		first, final float64
	}{{"remote", rFirst, rEval}, {"local", lFirst, lEval}} {
		if r.final > r.first/3 {
			t.Errorf("%s did not learn: held-out loss %.5f, first batch %.5f", r.name, r.final, r.first)
		}
	}
}
