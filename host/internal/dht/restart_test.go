package dht_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
)

// restartPeriod is the restart tests' update period: the swarm must heal
// within 2 × restartPeriod of a restart.
const restartPeriod = 2 * time.Second

// found returns what srv's DiscoveryService finds of uids: the sorted
// endpoint URLs of each.
func found(ctx context.Context, srv *host.Server, uids []string) (map[string][]string, error) {
	res, err := moehostv1connect.NewDiscoveryServiceClient(http.DefaultClient, "http://"+srv.Addr()).
		FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: uids}))
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, f := range res.Msg.GetFound() {
		for _, e := range f.GetEndpoints() {
			out[f.GetName()] = append(out[f.GetName()], e.GetUrl())
		}
		slices.Sort(out[f.GetName()])
	}
	return out, nil
}

// seesAll reports whether every server finds every uid of want at
// exactly its URLs, and knows every other server as a DHT peer.
func seesAll(servers []*host.Server, want map[string][]string) (bool, string) {
	var uids []string
	for u := range want {
		uids = append(uids, u)
	}
	slices.Sort(uids)
	var ids []string
	for _, s := range servers {
		info, _ := s.DHT()
		ids = append(ids, info.PeerID)
	}
	for i, s := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := found(ctx, s, uids)
		cancel()
		if err != nil {
			return false, fmt.Sprintf("server %d: %v", i, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return false, fmt.Sprintf("server %d finds %v, want %v", i, got, want)
		}
		info, _ := s.DHT()
		for j, id := range ids {
			if j != i && !slices.Contains(info.Peers, id) {
				return false, fmt.Sprintf("server %d's peers %v lack server %d (%s)", i, info.Peers, j, id)
			}
		}
	}
	return true, ""
}

// waitSeesAll waits up to within for seesAll to hold.
func waitSeesAll(t *testing.T, within time.Duration, what string, servers []*host.Server, want map[string][]string) {
	t.Helper()
	begin := time.Now()
	for {
		ok, state := seesAll(servers, want)
		if ok {
			t.Logf("%s: %v", what, time.Since(begin))
			return
		}
		if time.Since(begin) > within {
			t.Fatalf("%s: not within %v: %s", what, within, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func urlOf(s *host.Server) []string { return []string{"http://" + s.Addr()} }

// TestSwarmHealsAfterBootstrapRestart restarts the node that another
// server joined through, on the same data dir: it comes back at the same
// DHT multiaddrs, and within 2 × update period of its restart both sides
// find each other's experts and peer again.
func TestSwarmHealsAfterBootstrapRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	boot := startServerEvery(t, restartPeriod, dir, host.DHTConfig{}, "heal.0")
	bootInfo, _ := boot.DHT()
	joiner := startServerEvery(t, restartPeriod, t.TempDir(), host.DHTConfig{InitialPeers: bootInfo.Addrs}, "heal.1")
	// Joining is not what is measured here: a generous bound.
	waitSeesAll(t, 30*time.Second, "joined", []*host.Server{boot, joiner},
		map[string][]string{"heal.0": urlOf(boot), "heal.1": urlOf(joiner)})

	if err := boot.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	boot = startServerEvery(t, restartPeriod, dir, host.DHTConfig{}, "heal.0")
	if info, _ := boot.DHT(); info.PeerID != bootInfo.PeerID || !slices.Equal(info.Addrs, bootInfo.Addrs) {
		t.Errorf("restarted at %v, was at %v", info.Addrs, bootInfo.Addrs)
	}
	waitSeesAll(t, 2*restartPeriod, "healed after the restart", []*host.Server{boot, joiner},
		map[string][]string{"heal.0": urlOf(boot), "heal.1": urlOf(joiner)})
}

// TestServerJoinsPastDeadInitialPeer starts a server whose initial peers
// are a dead server and a live one: it starts, joins the live one, and
// joins the dead one too within 2 × update period of its return.
func TestServerJoinsPastDeadInitialPeer(t *testing.T) {
	t.Parallel()
	deadDir := t.TempDir()
	dead := startServerEvery(t, restartPeriod, deadDir, host.DHTConfig{}, "past.0")
	deadInfo, _ := dead.DHT()
	if err := dead.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	live := startServerEvery(t, restartPeriod, t.TempDir(), host.DHTConfig{}, "past.1")
	liveInfo, _ := live.DHT()
	srv := startServerEvery(t, restartPeriod, t.TempDir(),
		host.DHTConfig{InitialPeers: slices.Concat(deadInfo.Addrs, liveInfo.Addrs)}, "past.2")
	waitSeesAll(t, 30*time.Second, "joined the live peer", []*host.Server{live, srv},
		map[string][]string{"past.1": urlOf(live), "past.2": urlOf(srv)})

	back := startServerEvery(t, restartPeriod, deadDir, host.DHTConfig{}, "past.0")
	waitSeesAll(t, 2*restartPeriod, "joined the dead peer once back", []*host.Server{back, srv},
		map[string][]string{"past.0": urlOf(back), "past.2": urlOf(srv)})
}
