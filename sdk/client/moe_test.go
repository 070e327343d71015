package client_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

const hidden = 4

// startServer starts a server on a free loopback port with a data dir of
// its own, and shuts it down when the test ends.
func startServer(t *testing.T, opts ...host.Option) *host.Server {
	t.Helper()
	srv, err := host.New(append([]host.Option{host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return srv
}

// startExpertServer starts a server hosting one ffn expert in a DHT swarm.
// Its SGD learning rate is so small that training leaves the parameters
// as they are, so that the test can call the experts again to compare.
func startExpertServer(t *testing.T, uid string, peers []string) *host.Server {
	t.Helper()
	return startServer(t,
		host.WithExperts(host.ExpertConfig{UID: uid, Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": hidden}}),
		host.WithOptimizer(host.OptimizerConfig{Name: "sgd", LR: 1e-30}),
		// Records live twice the period: at 1 s, a race run on a loaded
		// machine let a live expert's record lapse between refreshes.
		host.WithUpdatePeriod(5*time.Second), host.WithDHT(host.DHTConfig{InitialPeers: peers}))
}

// TestMixtureOfExpertsSurvivesAKilledExpert runs a 2×2 grid with three
// experts on three servers, kills one mid-run, and checks that the
// mixture still answers while k_min is met, fails clearly when it is not,
// and that its outputs and gradients (of the input and of the gate
// scores) match a local computation over the surviving experts.
func TestMixtureOfExpertsSurvivesAKilledExpert(t *testing.T) {
	t.Parallel()
	uids := []string{"moe.0.0", "moe.0.1", "moe.1.1"}
	first := startExpertServer(t, uids[0], nil)
	info, _ := first.DHT()
	servers := []*host.Server{first, startExpertServer(t, uids[1], info.Addrs), startExpertServer(t, uids[2], info.Addrs)}
	urls := map[string]string{}
	for i, s := range servers {
		urls[uids[i]] = "http://" + s.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sw, err := client.NewSwarm(ctx, info.Addrs, client.WithCacheTTL(0), client.WithNegativeTTL(0))
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		found, err := sw.Discover(ctx, []string{"moe."})
		if err == nil && len(found) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grid not discoverable: %v %v", found, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	r := rand.New(rand.NewPCG(3, 4))
	const batch = 3
	x := make([]float32, batch*hidden)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	scores := make([][][]float64, batch)
	for b := range scores {
		scores[b] = [][]float64{{r.NormFloat64(), r.NormFloat64()}, {r.NormFloat64(), r.NormFloat64()}}
	}
	dy := make([]float32, batch*hidden)
	for i := range dy {
		dy[i] = float32(r.NormFloat64())
	}
	xt, dyt := client.Float32([]int64{batch, hidden}, x), client.Float32([]int64{batch, hidden}, dy)

	moe, err := client.NewMixtureOfExperts(sw, client.MoEConfig{Prefix: "moe", K: 3, KMin: 2, TimeoutAfterKMin: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer moe.Close()
	out, err := moe.Forward(ctx, xt, scores)
	if err != nil {
		t.Fatal(err)
	}
	for b := range batch {
		if len(out.Experts[b]) != 3 {
			t.Fatalf("sample %d mixed %v, want all three experts", b, out.Experts[b])
		}
	}
	checkAgainstLocal(t, ctx, moe, out, xt, dyt, scores, urls)

	// Stop the server of moe.0.1: it withdraws its record, or, if the
	// withdrawal is not seen yet, the mixture calls it, fails and bans it.
	if err := servers[1].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = moe.Forward(ctx, xt, scores)
	if err != nil {
		t.Fatalf("forward with k_min 2 and 2 experts alive: %v", err)
	}
	for b := range batch {
		if strings.Join(out.Experts[b], ",") != "moe.0.0,moe.1.1" && strings.Join(out.Experts[b], ",") != "moe.1.1,moe.0.0" {
			t.Fatalf("sample %d mixed %v, want the two survivors", b, out.Experts[b])
		}
	}
	if found, _ := sw.Discover(ctx, []string{"moe.0.1"}); len(found) > 0 && !moe.Banned(urls["moe.0.1"]) {
		t.Error("the dead endpoint is neither withdrawn nor banned")
	}
	checkAgainstLocal(t, ctx, moe, out, xt, dyt, scores, urls)

	strict, err := client.NewMixtureOfExperts(sw, client.MoEConfig{Prefix: "moe", K: 3, KMin: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer strict.Close()
	_, err = strict.Forward(ctx, xt, scores)
	// The dead server's record may have expired by now (2 of 2 found),
	// or not (2 of 3): either way two answered, one short of k_min.
	if !errors.Is(err, client.ErrKMinNotMet) || !(strings.Contains(err.Error(), "2 of 3 experts answered, k_min is 3") ||
		strings.Contains(err.Error(), "2 of 2 experts answered, k_min is 3")) {
		t.Errorf("forward with k_min 3 and 2 experts alive: %v, want ErrKMinNotMet", err)
	}
}

// checkAgainstLocal compares the mixture's output and gradients with a
// computation from the survivors' own outputs and input gradients,
// fetched directly, and with finite differences for the gate scores.
func checkAgainstLocal(t *testing.T, ctx context.Context, moe *client.MixtureOfExperts, out *client.MoEOutput, x, dy client.Tensor, scores [][][]float64, urls map[string]string) {
	t.Helper()
	gx, gscores, err := moe.Backward(ctx, out, dy)
	if err != nil {
		t.Fatal(err)
	}
	xs, _ := x.Float32s()
	dys, _ := dy.Float32s()
	gxs, _ := gx.Float32s()
	ys, _ := out.Output.Float32s()
	for b := range scores {
		row := client.Float32([]int64{1, hidden}, xs[b*hidden:(b+1)*hidden])
		dyRow := dys[b*hidden : (b+1)*hidden]
		var outs [][]float32
		var logits []float64
		for _, uid := range out.Experts[b] {
			e := client.New(urls[uid]).Expert(uid)
			o, err := e.Forward(ctx, row)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := o[0].Float32s()
			outs = append(outs, v)
			logits = append(logits, logitOf(scores[b], uid))
		}
		mix := func(logits []float64) []float64 {
			w := softmaxRef(logits)
			y := make([]float64, hidden)
			for j := range outs {
				for i := range y {
					y[i] += w[j] * float64(outs[j][i])
				}
			}
			return y
		}
		w := softmaxRef(logits)
		y := mix(logits)
		wantGX := make([]float64, hidden)
		for j, uid := range out.Experts[b] {
			scaled := make([]float32, hidden)
			for i := range scaled {
				scaled[i] = float32(w[j]) * dyRow[i]
			}
			g, err := client.New(urls[uid]).Expert(uid).Backward(ctx, []client.Tensor{row}, []client.Tensor{client.Float32([]int64{1, hidden}, scaled)})
			if err != nil {
				t.Fatal(err)
			}
			gv, _ := g[0].Float32s()
			for i := range wantGX {
				wantGX[i] += float64(gv[i])
			}
		}
		for i := range hidden {
			near(t, "output", ys[b*hidden+i], y[i])
			near(t, "input gradient", gxs[b*hidden+i], wantGX[i])
		}
		// Gate gradients by central differences of L = dy·y(logits).
		for d := range scores[b] {
			for c := range scores[b][d] {
				const h = 1e-4
				lp, lm := make([]float64, len(logits)), make([]float64, len(logits))
				for j, uid := range out.Experts[b] {
					lp[j], lm[j] = logits[j], logits[j]
					if coordOf(uid, d) == c {
						lp[j] += h
						lm[j] -= h
					}
				}
				num := (dotRef(dyRow, mix(lp)) - dotRef(dyRow, mix(lm))) / (2 * h)
				if math.Abs(gscores[b][d][c]-num) > 1e-3*(1+math.Abs(num)) {
					t.Errorf("sample %d: gradient of score[%d][%d] = %g, finite differences %g", b, d, c, gscores[b][d][c], num)
				}
			}
		}
	}
}

func near(t *testing.T, what string, got float32, want float64) {
	t.Helper()
	if math.Abs(float64(got)-want) > 1e-4*(1+math.Abs(want)) {
		t.Errorf("%s = %g, want %g", what, got, want)
	}
}

func coordOf(uid string, d int) int { return int(strings.Split(uid, ".")[1+d][0] - '0') }

func logitOf(scores [][]float64, uid string) float64 {
	s := 0.0
	for d := range scores {
		s += scores[d][coordOf(uid, d)]
	}
	return s
}

func softmaxRef(l []float64) []float64 {
	out := make([]float64, len(l))
	sum := 0.0
	for i, v := range l {
		out[i] = math.Exp(v)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

func dotRef(a []float32, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += float64(a[i]) * b[i]
	}
	return s
}
