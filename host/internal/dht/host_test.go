package dht_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/internal/dht"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/internal/testing/grpcreflect"
	"github.com/moehost/moehost/sdk/swarm"
)

// startServer starts a server hosting nop experts with a DHT node.
func startServer(t *testing.T, dataDir string, d host.DHTConfig, uids ...string) *host.Server {
	t.Helper()
	return startServerEvery(t, 500*time.Millisecond, dataDir, d, uids...)
}

// startServerEvery is startServer with the given update period.
func startServerEvery(t *testing.T, period time.Duration, dataDir string, d host.DHTConfig, uids ...string) *host.Server {
	t.Helper()
	var experts []host.ExpertConfig
	for _, u := range uids {
		experts = append(experts, host.ExpertConfig{UID: u, Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}})
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(dataDir), host.WithExperts(experts...),
		host.WithUpdatePeriod(period), host.WithDHT(d))
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

func findUntil(t *testing.T, n *swarm.Node, name string, want int) []swarm.Record {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		recs, err := n.Find(ctx, name)
		cancel()
		if err == nil && len(recs) == want {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("Find(%s) = %d records (%v), want %d", name, len(recs), err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServerJoinsAnnouncesAndServesDiscovery checks the server's DHT
// wiring: dht-addrs is on disk by Ready, the experts and their grid
// prefixes are announced, DiscoveryService answers and is listed in
// reflection, the metrics are in /metrics, and a graceful shutdown stops
// announcing so that the records expire.
func TestServerJoinsAnnouncesAndServesDiscovery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := startServer(t, dir, host.DHTConfig{}, "nop.0.1", "nop.2.0", "solo")
	info, ok := srv.DHT()
	if !ok {
		t.Fatal("DHT() reports no node")
	}
	b, err := os.ReadFile(filepath.Join(dir, dht.AddrsFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); !slices.Equal(got, info.Addrs) || len(got) == 0 {
		t.Errorf("dht-addrs = %v, DHT().Addrs = %v", got, info.Addrs)
	}
	url := "http://" + srv.Addr()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peer, err := swarm.NewNode(ctx, swarm.Config{Client: true, InitialPeers: info.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	recs := findUntil(t, peer, "nop.0.1", 1)
	if r := recs[0]; r.PeerID != info.PeerID || !slices.Equal(r.URLs, []string{url}) || !strings.HasPrefix(r.Digest, "sha256:") ||
		time.Until(r.Expires) > 3*time.Second || r.Expires.Before(time.Now()) {
		t.Errorf("record %+v", r)
	}
	if got := findUntil(t, peer, "nop.", 1)[0].Children; !slices.Equal(got, []int32{0, 2}) {
		t.Errorf("nop. children = %v, want [0 2]", got)
	}
	if got := findUntil(t, peer, "nop.2.", 1)[0].Children; !slices.Equal(got, []int32{0}) {
		t.Errorf("nop.2. children = %v, want [0]", got)
	}
	if info, _ := srv.DHT(); !slices.Equal(info.Records, []string{"nop.", "nop.0.", "nop.0.1", "nop.2.", "nop.2.0", "solo"}) {
		t.Errorf("DHT().Records = %v", info.Records)
	}

	// ServerService reports the node as DHT() does.
	sres, err := moehostv1connect.NewServerServiceClient(http.DefaultClient, url).GetServerInfo(ctx, connect.NewRequest(&moehostv1.GetServerInfoRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if si := sres.Msg; si.GetPeerId() != info.PeerID || !slices.Equal(si.GetDhtAddresses(), info.Addrs) ||
		!slices.Equal(si.GetAnnounceAddresses(), []string{url}) || !slices.Contains(si.GetDhtRecords(), "nop.2.0") {
		t.Errorf("GetServerInfo = %v, want peer %s at %v announcing %s", si, info.PeerID, info.Addrs, url)
	}

	dc := moehostv1connect.NewDiscoveryServiceClient(http.DefaultClient, url, connect.WithGRPC())
	res, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "nop", K: 5,
		GridScores: []*moehostv1.Scores{{Values: []float64{1, 0, 3}}, {Values: []float64{0.5, 0.25}}}}))
	if err != nil {
		t.Fatal(err)
	}
	if e := res.Msg.GetExperts(); len(e) != 2 || e[0].GetUid() != "nop.2.0" || e[0].GetScore() != 3.5 || e[1].GetUid() != "nop.0.1" ||
		len(e[0].GetEndpoints()) != 1 || e[0].GetEndpoints()[0].GetUrl() != url {
		t.Errorf("BeamSearch = %v", res.Msg)
	}

	if services := grpcreflect.Services(t, srv.Addr()); !slices.Contains(services, moehostv1connect.DiscoveryServiceName) {
		t.Errorf("reflection lists %v, without DiscoveryService", services)
	}

	mres, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(mres.Body)
	mres.Body.Close()
	for _, m := range []string{"moehost_dht_peers", `moehost_dht_records_announced_total{result="no_peers"}`, "moehost_dht_announce_seconds_count", "moehost_dht_lookups_total", "moehost_dht_lookup_seconds_count"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	begin := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for len(findUntilAny(peer, "nop.0.1")) > 0 {
		if time.Since(begin) > dht.MinExpiry+2*time.Second {
			t.Fatalf("records still found %v after shutdown", time.Since(begin))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("records gone %v after shutdown", time.Since(begin))
}

func findUntilAny(n *swarm.Node, name string) []swarm.Record {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	recs, _ := n.Find(ctx, name)
	return recs
}

// TestServerKeepsPeerID restarts a server on its data dir.
func TestServerKeepsPeerID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := startServer(t, dir, host.DHTConfig{}, "a.0")
	info1, _ := first.DHT()
	if err := first.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := startServer(t, dir, host.DHTConfig{}, "a.0")
	info2, _ := second.DHT()
	if info1.PeerID == "" || info1.PeerID != info2.PeerID {
		t.Errorf("peer ID %q after restart, was %q", info2.PeerID, info1.PeerID)
	}
}

func TestDHTOptionsValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opts    []host.Option
		wantErr string
	}{
		{"unspecified listen needs announce", []host.Option{host.WithListen("0.0.0.0:7700"), host.WithDHT(host.DHTConfig{})}, "--announce"},
		{"ipv6 unspecified too", []host.Option{host.WithListen("[::]:7700"), host.WithDHT(host.DHTConfig{})}, "--announce"},
		{"announce must be http", []host.Option{host.WithDHT(host.DHTConfig{Announce: []string{"ftp://x"}})}, "http"},
		{"negative period", []host.Option{host.WithUpdatePeriod(-time.Second)}, "not positive"},
		{"announce given", []host.Option{host.WithListen("0.0.0.0:7700"), host.WithDHT(host.DHTConfig{Announce: []string{"http://example.com:7700"}})}, ""},
		{"no dht, unspecified listen", []host.Option{host.WithListen("0.0.0.0:7700")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := host.New(tt.opts...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New = %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

// TestDiscoveryRejectsBadRequests checks that bad requests get
// InvalidArgument with a message, and no DHT node runs without WithDHT.
func TestDiscoveryRejectsBadRequests(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), host.DHTConfig{}, "x.0")
	dc := moehostv1connect.NewDiscoveryServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	scores := []*moehostv1.Scores{{Values: []float64{1}}}
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"no names", func() error {
			_, err := dc.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{}))
			return err
		}, "no names"},
		{"bad name", func() error {
			_, err := dc.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: []string{"a/b"}}))
			return err
		}, "not a uid"},
		{"too many names", func() error {
			_, err := dc.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: make([]string, rpc.MaxFindNames+1)}))
			return err
		}, "more than"},
		{"k zero", func() error {
			_, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "x", GridScores: scores}))
			return err
		}, "k = 0"},
		{"no dims", func() error {
			_, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "x", K: 1}))
			return err
		}, "dimensions"},
		{"prefix with dot", func() error {
			_, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "x.", K: 1, GridScores: scores}))
			return err
		}, "prefix"},
		{"bad peer", func() error {
			info, _ := srv.DHT()
			_, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "x", K: 1, GridScores: scores,
				Peers: []string{info.PeerID, "12D3KooWnobody"}}))
			return err
		}, `peer "12D3KooWnobody" is not a libp2p peer ID`},
		{"too many peers", func() error {
			info, _ := srv.DHT()
			_, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "x", K: 1, GridScores: scores,
				Peers: slices.Repeat([]string{info.PeerID}, swarm.MaxBeamPeers+1)}))
			return err
		}, "1025 peers, more than 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want InvalidArgument mentioning %q", err, tt.want)
			}
			if err != nil && strings.Count(err.Error(), "invalid_argument") > 1 {
				t.Errorf("code repeated in %q", err)
			}
		})
	}

	plain, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer plain.Shutdown(ctx)
	if _, ok := plain.DHT(); ok {
		t.Error("a server without WithDHT runs a DHT node")
	}
	_, err = moehostv1connect.NewDiscoveryServiceClient(http.DefaultClient, "http://"+plain.Addr()).
		FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: []string{"x.0"}}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("DiscoveryService without DHT: %v, want Unimplemented", err)
	}
}

// TestBeamSearchOverTrustedPeers runs two servers in one swarm: a crowd
// hosting eight experts that outscore the trusted server's two, and the
// uid nop.0 on both. A beam search allowed only the trusted server's peer
// ID finds its experts, with its endpoints alone; without peers it finds
// the crowd's.
func TestBeamSearchOverTrustedPeers(t *testing.T) {
	t.Parallel()
	crowd := startServer(t, t.TempDir(), host.DHTConfig{}, "nop.0", "nop.1", "nop.2", "nop.3", "nop.4", "nop.5", "nop.6", "nop.7")
	crowdInfo, _ := crowd.DHT()
	trusted := startServer(t, t.TempDir(), host.DHTConfig{InitialPeers: crowdInfo.Addrs}, "nop.0", "nop.8", "nop.9")
	trustedInfo, _ := trusted.DHT()
	trustedURL := "http://" + trusted.Addr()
	// Ask the crowd's server: the records of both reach it through the DHT.
	dc := moehostv1connect.NewDiscoveryServiceClient(http.DefaultClient, "http://"+crowd.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	search := func(peers ...string) []*moehostv1.ScoredExpert {
		t.Helper()
		res, err := dc.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "nop", K: 2, Peers: peers,
			GridScores: []*moehostv1.Scores{{Values: []float64{10, 9, 8, 7, 6, 5, 4, 3, 1, 0}}}}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetExperts()
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if e := search(); len(e) > 0 && len(e[0].GetEndpoints()) == 2 && len(search(trustedInfo.PeerID)) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two servers' records never met: %v", search())
		}
	}
	got := search(trustedInfo.PeerID)
	if len(got) != 2 || got[0].GetUid() != "nop.0" || got[1].GetUid() != "nop.8" {
		t.Fatalf("BeamSearch over the trusted peer = %v, want nop.0 and nop.8", got)
	}
	for _, e := range got {
		if eps := e.GetEndpoints(); len(eps) != 1 || eps[0].GetPeerId() != trustedInfo.PeerID || eps[0].GetUrl() != trustedURL {
			t.Errorf("%s: endpoints %v, want the trusted server's alone", e.GetUid(), eps)
		}
	}
	if all := search(); len(all) != 2 || all[0].GetUid() != "nop.0" || all[1].GetUid() != "nop.1" {
		t.Errorf("BeamSearch over every peer = %v, want nop.0 and nop.1", all)
	}
	if both := search(trustedInfo.PeerID, crowdInfo.PeerID); len(both) != 2 || both[1].GetUid() != "nop.1" || len(both[0].GetEndpoints()) != 2 {
		t.Errorf("BeamSearch over both peers = %v, want nop.0 (two endpoints) and nop.1", both)
	}
}
