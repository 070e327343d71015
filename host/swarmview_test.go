package host

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/ui"
)

func getSwarm(t *testing.T, srv *Server) ui.Swarm {
	t.Helper()
	res, err := http.Get("http://" + srv.Addr() + "/ui/api/swarm")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v ui.Swarm
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/api/swarm: %s, %v", res.Status, err)
	}
	return v
}

// TestSwarmView: two servers in one swarm; the first's dashboard API
// lists both servers' records (uids and prefixes, with their signer, URL
// and expiry), and its ServerInfo gives the second as a peer with its
// multiaddrs. A server without a DHT node says so.
func TestSwarmView(t *testing.T) {
	t.Parallel()
	// ffn, which the test servers compiled already.
	ffn := func(uid string) ExpertConfig {
		return ExpertConfig{UID: uid, Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": 4}}
	}
	// Each server has its own data dir (its DHT key) and shares the
	// test servers' compiled modules (startTestServer).
	a := startTestServer(t, WithUpdatePeriod(500*time.Millisecond), WithDHT(DHTConfig{}), WithExperts(ffn("nop.0")))
	ai, _ := a.DHT()
	b := startTestServer(t, WithUpdatePeriod(500*time.Millisecond),
		WithDHT(DHTConfig{InitialPeers: ai.Addrs}), WithExperts(ffn("nop.1"), ffn("solo")))
	bi, _ := b.DHT()

	want := []string{"nop.@" + ai.PeerID, "nop.@" + bi.PeerID, "nop.0@" + ai.PeerID, "nop.1@" + bi.PeerID, "solo@" + bi.PeerID}
	slices.SortFunc(want[:2], strings.Compare)
	var v ui.Swarm
	var got []string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		v = getSwarm(t, a)
		got = got[:0]
		for _, r := range v.Records {
			got = append(got, r.Name+"@"+r.PeerID)
		}
		if slices.Equal(got, want) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("swarm records %v, want %v", got, want)
	}
	if !v.DHT || v.Self != ai.PeerID || v.Total != len(want) || v.Limit != swarmViewLimit {
		t.Errorf("swarm %+v", v)
	}
	for _, r := range v.Records {
		if left := time.Duration(r.ExpiresUnixMs-v.NowUnixMs) * time.Millisecond; left <= 0 || left > time.Minute {
			t.Errorf("%s expires in %v", r.Name, left)
		}
		if r.Name == "nop.1" && (!slices.Equal(r.URLs, []string{"http://" + b.Addr()}) || !strings.HasPrefix(r.Digest, "sha256:")) {
			t.Errorf("nop.1's record %+v", r)
		}
	}

	// The peer, with the multiaddrs it listens on (without /p2p/).
	ctx := context.Background()
	var peer *moehostv1.PeerInfo
	for time.Now().Before(deadline) && peer == nil {
		res, err := moehostv1connect.NewServerServiceClient(http.DefaultClient, "http://"+a.Addr()).GetServerInfo(ctx, connect.NewRequest(&moehostv1.GetServerInfoRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Msg.GetPeers() {
			if p.GetPeerId() == bi.PeerID && len(p.GetAddresses()) > 0 {
				peer = p
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if peer == nil {
		t.Fatalf("ServerInfo gives no addresses for peer %s", bi.PeerID)
	}
	listen := strings.TrimSuffix(bi.Addrs[0], "/p2p/"+bi.PeerID)
	if !slices.Contains(peer.GetAddresses(), listen) || len(peer.GetAddresses()) > maxPeerAddrs {
		t.Errorf("peer %s addresses %v, want %s among at most %d", bi.PeerID, peer.GetAddresses(), listen, maxPeerAddrs)
	}

	solo := startTestServer(t, WithoutDHT(), WithExperts(ffn("nop.0")))
	if v := getSwarm(t, solo); v.DHT || len(v.Records) != 0 {
		t.Errorf("without a DHT node: %+v", v)
	}
}
