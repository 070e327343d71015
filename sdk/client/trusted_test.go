package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
	"github.com/moehost/moehost/sdk/swarm"
)

// startGridServer starts a server hosting nop experts in a DHT swarm.
func startGridServer(t *testing.T, peers []string, uids ...string) *host.Server {
	t.Helper()
	var experts []host.ExpertConfig
	for _, u := range uids {
		experts = append(experts, host.ExpertConfig{UID: u, Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": hidden}})
	}
	return startServer(t, host.WithExperts(experts...),
		host.WithUpdatePeriod(5*time.Second), host.WithDHT(host.DHTConfig{InitialPeers: peers}))
}

// TestMixtureFindsTrustedExpertsBelowACrowd runs a crowd server whose
// eight experts outscore the two of a trusted server (k = 2, four times
// over): a mixture pinned to the trusted server's key finds and calls its
// experts, through the swarm and through the crowd's own
// DiscoveryService, and a directory's BeamSearch returns the trusted
// server's endpoints alone.
func TestMixtureFindsTrustedExpertsBelowACrowd(t *testing.T) {
	t.Parallel()
	crowd := startGridServer(t, nil, "trust.0", "trust.1", "trust.2", "trust.3", "trust.4", "trust.5", "trust.6", "trust.7")
	crowdInfo, _ := crowd.DHT()
	trusted := startGridServer(t, crowdInfo.Addrs, "trust.8", "trust.9")
	trustedInfo, _ := trusted.DHT()
	trustedURL := "http://" + trusted.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sw, err := client.NewSwarm(ctx, crowdInfo.Addrs, client.WithCacheTTL(0), client.WithNegativeTTL(0))
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	dc := client.NewDiscoveryClient("http://" + crowd.Addr())
	defer dc.Close()
	scores := [][]float64{{10, 9, 8, 7, 6, 5, 4, 3, 1, 0}}
	for _, dir := range []struct {
		name string
		client.Directory
	}{{"swarm", sw}, {"discovery", dc}} {
		t.Run(dir.name, func(t *testing.T) {
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				found, err := dir.Discover(ctx, []string{"trust."})
				if err == nil && len(found) == 10 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("grid not discoverable: %v %v", found, err)
				}
			}
			choices, err := dir.BeamSearch(ctx, "trust", scores, 2, []string{trustedInfo.PeerID})
			if err != nil {
				t.Fatal(err)
			}
			if len(choices) != 2 || choices[0].UID != "trust.8" || choices[1].UID != "trust.9" {
				t.Fatalf("BeamSearch = %v, want trust.8 and trust.9", choices)
			}
			for _, c := range choices {
				if len(c.Endpoints) != 1 || c.Endpoints[0].PeerID != trustedInfo.PeerID || c.Endpoints[0].URL != trustedURL {
					t.Errorf("%s: endpoints %v, want the trusted server's alone", c.UID, c.Endpoints)
				}
			}

			moe, err := client.NewMixtureOfExperts(dir, client.MoEConfig{Prefix: "trust", K: 2, KMin: 2, TrustedPeers: []string{trustedInfo.PeerID}})
			if err != nil {
				t.Fatal(err)
			}
			defer moe.Close()
			out, err := moe.Forward(ctx, client.Float32([]int64{2, hidden}, []float32{1, 2, 3, 4, 5, 6, 7, 8}), [][][]float64{scores, scores})
			if err != nil {
				t.Fatal(err)
			}
			for b, uids := range out.Experts {
				if !slices.Equal(uids, []string{"trust.8", "trust.9"}) {
					t.Errorf("sample %d mixed %v, want trust.8 and trust.9", b, uids)
				}
			}
		})
	}
}

func TestMixtureRejectsBadTrustedPeers(t *testing.T) {
	t.Parallel()
	good := newPeerID(t)
	tests := []struct {
		name  string
		peers []string
		want  string
	}{
		{"not a peer ID", []string{good, "12D3KooWnobody"}, `"12D3KooWnobody" is not a libp2p peer ID`},
		{"too many", slices.Repeat([]string{good}, swarm.MaxBeamPeers+1), "more than 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := client.NewMixtureOfExperts(fixedDirectory{}, client.MoEConfig{Prefix: "x", K: 1, TrustedPeers: tt.peers})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one mentioning %s", err, tt.want)
			}
		})
	}
}

// lyingDiscovery is a DiscoveryService that ignores the allow-list.
type lyingDiscovery struct {
	moehostv1connect.UnimplementedDiscoveryServiceHandler
	experts []*moehostv1.ScoredExpert
}

func (l lyingDiscovery) BeamSearch(context.Context, *connect.Request[moehostv1.BeamSearchRequest]) (*connect.Response[moehostv1.BeamSearchResponse], error) {
	return connect.NewResponse(&moehostv1.BeamSearchResponse{Experts: l.experts}), nil
}

// TestDiscoveryClientDropsUntrustedEndpoints checks that the
// DiscoveryClient does not rely on the server to filter: of what a
// server that ignores the allow-list returns, it keeps the allowed
// peers' endpoints and the experts that have one.
func TestDiscoveryClientDropsUntrustedEndpoints(t *testing.T) {
	t.Parallel()
	stranger, trusted := newPeerID(t), newPeerID(t)
	mux := http.NewServeMux()
	mux.Handle(moehostv1connect.NewDiscoveryServiceHandler(lyingDiscovery{experts: []*moehostv1.ScoredExpert{
		{Uid: "g.0", Score: 3, Endpoints: []*moehostv1.Endpoint{{Url: "http://stranger", PeerId: stranger}}},
		{Uid: "g.1", Score: 2, Endpoints: []*moehostv1.Endpoint{{Url: "http://stranger", PeerId: stranger}, {Url: "http://trusted", PeerId: trusted}}},
	}}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true) // the client speaks h2c
	srv.Start()
	defer srv.Close()
	dc := client.NewDiscoveryClient(srv.URL)
	defer dc.Close()
	got, err := dc.BeamSearch(context.Background(), "g", [][]float64{{3, 2}}, 2, []string{trusted})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].UID != "g.1" || len(got[0].Endpoints) != 1 || got[0].Endpoints[0].URL != "http://trusted" {
		t.Errorf("BeamSearch = %+v, want g.1 at http://trusted alone", got)
	}
	all, err := dc.BeamSearch(context.Background(), "g", [][]float64{{3, 2}}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || len(all[1].Endpoints) != 2 {
		t.Errorf("BeamSearch without peers = %+v, want both experts with every endpoint", all)
	}
}
