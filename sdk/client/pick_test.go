package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
	"github.com/moehost/moehost/sdk/swarm"
)

// fixedDirectory finds one uid at fixed endpoints.
type fixedDirectory struct {
	uid string
	eps []client.Endpoint
}

func (d fixedDirectory) Discover(context.Context, []string) (map[string][]client.Endpoint, error) {
	return map[string][]client.Endpoint{d.uid: d.eps}, nil
}

func (d fixedDirectory) DiscoverPages(ctx context.Context, names []string, yield func(map[string][]client.Endpoint) bool) error {
	found, _ := d.Discover(ctx, names)
	yield(found)
	return nil
}

// BeamSearch ignores peers, as a discovery server that does not filter
// would.
func (d fixedDirectory) BeamSearch(context.Context, string, [][]float64, int, []string) ([]client.Choice, error) {
	return []client.Choice{{UID: d.uid, Endpoints: d.eps}}, nil
}

// TestMixturePrefersMeasuredOverClaimedLoad gives the mixture two
// endpoints of one expert on a real server: one direct, announcing a
// queue depth of 100, and one through a proxy that adds 200 ms, announcing
// 0 (a record may claim anything). After one call to each, the mixture
// calls the endpoint it measured faster, whatever the records claim.
func TestMixturePrefersMeasuredOverClaimedLoad(t *testing.T) {
	t.Parallel()
	srv := startServer(t, host.WithExperts(host.ExpertConfig{UID: "pick.0", Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": hidden}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct := "http://" + srv.Addr()
	backend, _ := url.Parse(direct)
	var slowCalls atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(backend)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ps := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slowCalls.Add(1)
		time.Sleep(200 * time.Millisecond)
		proxy.ServeHTTP(w, r)
	}), Protocols: new(http.Protocols)}
	ps.Protocols.SetHTTP1(true)
	ps.Protocols.SetUnencryptedHTTP2(true)
	go ps.Serve(ln)
	t.Cleanup(func() { ps.Close() })
	slow := "http://" + ln.Addr().String()

	dir := fixedDirectory{uid: "pick.0", eps: []client.Endpoint{
		{URL: slow, QueueDepth: 0},
		{URL: direct, QueueDepth: 100},
	}}
	moe, err := client.NewMixtureOfExperts(dir, client.MoEConfig{Prefix: "pick", K: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer moe.Close()
	x := client.Float32([]int64{1, hidden}, []float32{1, 2, 3, 4})
	const calls = 8
	for range calls {
		if _, err := moe.Forward(ctx, x, [][][]float64{{{1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := slowCalls.Load(); n > 1 {
		t.Errorf("the slow endpoint that claims no load got %d of %d calls; want at most the one that measured it", n, calls)
	}

	// Pinned host keys: the endpoint signed by another key is never
	// called, although the directory returned it.
	slowCalls.Store(0)
	stranger, honest := newPeerID(t), newPeerID(t)
	dir.eps[0].PeerID, dir.eps[1].PeerID = stranger, honest
	pinned, err := client.NewMixtureOfExperts(dir, client.MoEConfig{Prefix: "pick", K: 1, TrustedPeers: []string{honest}})
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	for range 3 {
		if _, err := pinned.Forward(ctx, x, [][][]float64{{{1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := slowCalls.Load(); n != 0 {
		t.Errorf("an endpoint of an untrusted peer got %d calls", n)
	}
}

func newPeerID(t *testing.T) string {
	t.Helper()
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return id.PeerID()
}

// rankedDirectory's beam search returns the best k of a fixed ranking of
// experts, each at one endpoint, and records the k it was asked for.
type rankedDirectory struct {
	fixedDirectory
	ranked []client.Choice
	asked  *atomic.Int64 // the k of the last beam search
}

func (d rankedDirectory) BeamSearch(_ context.Context, _ string, _ [][]float64, k int, _ []string) ([]client.Choice, error) {
	d.asked.Store(int64(k))
	return d.ranked[:min(k, len(d.ranked))], nil
}

// TestMixtureReplacesBannedExperts ranks an expert whose server is down
// first: the call that finds it down bans it, and from then on the
// mixture asks for more experts and calls the next best two instead.
func TestMixtureReplacesBannedExperts(t *testing.T) {
	t.Parallel()
	var experts []host.ExpertConfig
	for _, uid := range []string{"rank.1", "rank.2"} {
		experts = append(experts, host.ExpertConfig{UID: uid, Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": hidden}})
	}
	srv := startServer(t, host.WithExperts(experts...))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there
	live := "http://" + srv.Addr()
	dir := rankedDirectory{asked: new(atomic.Int64), ranked: []client.Choice{
		{UID: "rank.0", Endpoints: []client.Endpoint{{URL: down}}},
		{UID: "rank.1", Endpoints: []client.Endpoint{{URL: live}}},
		{UID: "rank.2", Endpoints: []client.Endpoint{{URL: live}}},
	}}
	moe, err := client.NewMixtureOfExperts(dir, client.MoEConfig{Prefix: "rank", K: 2, KMin: 2, BanBase: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer moe.Close()
	x := client.Float32([]int64{1, hidden}, []float32{1, 2, 3, 4})
	scores := [][][]float64{{{3, 2, 1}}}
	if _, err := moe.Forward(ctx, x, scores); !errors.Is(err, client.ErrKMinNotMet) {
		t.Fatalf("forward with the best expert's server down = %v, want ErrKMinNotMet", err)
	}
	if !moe.Banned(down) {
		t.Fatalf("%s is not banned after failing", down)
	}
	out, err := moe.Forward(ctx, x, scores)
	if err != nil {
		t.Fatalf("forward with a banned server and two more experts: %v", err)
	}
	if got := strings.Join(out.Experts[0], ","); got != "rank.1,rank.2" {
		t.Errorf("mixed %s, want rank.1,rank.2", got)
	}
	if k := dir.asked.Load(); k != 4 {
		t.Errorf("beam search asked for %d experts with one server banned, want 4 (K × (1 + 1 ban))", k)
	}
}
