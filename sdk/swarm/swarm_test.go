package swarm_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	ds "github.com/ipfs/go-datastore"
	dsq "github.com/ipfs/go-datastore/query"
	dssync "github.com/ipfs/go-datastore/sync"

	"go.uber.org/goleak"

	"github.com/moehost/moehost/sdk/swarm"
)

// Every test closes what it started, including nodes that failed to
// start: no goroutine may outlive the package's tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startNode(t testing.TB, cfg swarm.Config) *swarm.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := swarm.NewNode(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// startSwarm starts n server nodes, each joined through the first.
func startSwarm(t testing.TB, n int) []*swarm.Node {
	t.Helper()
	nodes := []*swarm.Node{startNode(t, swarm.Config{})}
	for range n - 1 {
		nodes = append(nodes, startNode(t, swarm.Config{InitialPeers: nodes[0].Addrs()}))
	}
	return nodes
}

func announce(t testing.TB, n *swarm.Node, r swarm.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Announce(ctx, r); err != nil {
		t.Fatalf("Announce(%s): %v", r.Name, err)
	}
}

func find(t testing.TB, n *swarm.Node, name string) []swarm.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := n.Find(ctx, name)
	if err != nil {
		t.Fatalf("Find(%s): %v", name, err)
	}
	return recs
}

func peersOf(recs []swarm.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.PeerID)
	}
	return out
}

// TestSwarmFindsEveryAnnouncer runs 8 server nodes and a client node that
// knows only one of them; every announced uid is found, with one record
// per server that hosts it, and a short-lived record vanishes once it
// expires.
func TestSwarmFindsEveryAnnouncer(t *testing.T) {
	t.Parallel()
	nodes := startSwarm(t, 8)
	exp := time.Now().Add(time.Minute)
	for i, n := range nodes {
		announce(t, n, swarm.Record{Name: "ffn." + string(rune('0'+i)), URLs: []string{"http://h" + string(rune('0'+i))}, Expires: exp})
	}
	// Two servers host "shared.0".
	announce(t, nodes[2], swarm.Record{Name: "shared.0", URLs: []string{"http://a"}, Expires: exp})
	announce(t, nodes[5], swarm.Record{Name: "shared.0", URLs: []string{"http://b"}, Expires: exp})
	client := startNode(t, swarm.Config{Client: true, InitialPeers: nodes[7].Addrs()})
	for i, n := range nodes {
		recs := find(t, client, "ffn."+string(rune('0'+i)))
		if len(recs) != 1 || recs[0].PeerID != n.PeerID() || recs[0].URLs[0] != "http://h"+string(rune('0'+i)) {
			t.Errorf("ffn.%d: found %+v, want node %d's record", i, recs, i)
		}
	}
	want := []string{nodes[2].PeerID(), nodes[5].PeerID()}
	slices.Sort(want)
	if got := peersOf(find(t, client, "shared.0")); !slices.Equal(got, want) {
		t.Errorf("shared.0 found on %v, want %v", got, want)
	}
	if got := find(t, client, "nobody.0"); len(got) != 0 {
		t.Errorf("nobody.0 found: %+v", got)
	}

	// A record that expires soon disappears from lookups.
	announce(t, nodes[3], swarm.Record{Name: "brief.0", URLs: []string{"http://c"}, Expires: time.Now().Add(1500 * time.Millisecond)})
	if got := find(t, client, "brief.0"); len(got) != 1 {
		t.Fatalf("brief.0 before expiry: %+v", got)
	}
	time.Sleep(1600 * time.Millisecond)
	if got := find(t, client, "brief.0"); len(got) != 0 {
		t.Errorf("brief.0 after expiry: %+v", got)
	}
}

// TestFindAsksEachPeerOnce: a provider the client is connected to is on
// both of Find's paths (direct and DHT) and must be asked once a lookup.
func TestFindAsksEachPeerOnce(t *testing.T) {
	t.Parallel()
	nodes := startSwarm(t, 3)
	announce(t, nodes[1], swarm.Record{Name: "once.0", URLs: []string{"http://once"}, Expires: time.Now().Add(time.Minute)})
	client := startNode(t, swarm.Config{Client: true, InitialPeers: nodes[1].Addrs()})
	for i := range 3 {
		before := swarm.AskedOf(nodes[1])
		if got := find(t, client, "once.0"); len(got) != 1 || got[0].PeerID != nodes[1].PeerID() {
			t.Fatalf("find %d: %+v, want node 1's record", i, got)
		}
		if asked := swarm.AskedOf(nodes[1]) - before; asked != 1 {
			t.Errorf("find %d asked the provider %d times, want once", i, asked)
		}
	}
}

// TestPeersRefuseForgedRecords has a malicious node (one that skips
// validation) put records under an honest server's key; no honest peer
// stores them and lookups do not return them. Its own validly signed
// record is stored, so the check can see stored records.
func TestPeersRefuseForgedRecords(t *testing.T) {
	t.Parallel()
	stores := make([]ds.Batching, 4)
	var honest []*swarm.Node
	for i := range stores {
		stores[i] = dssync.MutexWrap(ds.NewMapDatastore())
		cfg := swarm.WithDatastore(swarm.Config{}, stores[i])
		if i > 0 {
			cfg.InitialPeers = honest[0].Addrs()
		}
		honest = append(honest, startNode(t, cfg))
	}
	victim := honest[1]
	mallory := startNode(t, swarm.Malicious(swarm.Config{InitialPeers: honest[0].Addrs()}))
	malloryID := mustIdentity(t) // a key that is not the victim's
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	exp := time.Now().Add(time.Minute)
	evil := swarm.Record{Name: "ffn.0", PeerID: victim.PeerID(), URLs: []string{"http://evil:1"}, Expires: exp}
	forgedSig, err := swarm.SignAs(malloryID, evil) // names the victim, signed by another key
	if err != nil {
		t.Fatal(err)
	}
	evil.PeerID = malloryID.PeerID()
	otherPeer, err := swarm.SignAs(malloryID, evil) // signed by mallory's key, but put under the victim's key
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range [][]byte{forgedSig, otherPeer} {
		_ = mallory.PutRaw(ctx, swarm.Key(victim.PeerID(), "ffn.0"), v)
	}
	// Control: a record mallory signs for itself is stored.
	announce(t, mallory, swarm.Record{Name: "ffn.9", URLs: []string{"http://mallory:1"}, Expires: exp})

	victimKey, ownKey := swarm.Key(victim.PeerID(), "ffn.0"), swarm.Key(mallory.PeerID(), "ffn.9")
	ownStored := 0
	for i, store := range stores {
		res, err := store.Query(ctx, dsq.Query{KeysOnly: false})
		if err != nil {
			t.Fatal(err)
		}
		all, err := res.Rest()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range all {
			if strings.Contains(string(e.Value), "evil:1") {
				t.Errorf("honest node %d stored a forged record under %s", i, e.Key)
			}
			if strings.Contains(string(e.Value), "mallory:1") {
				ownStored++
			}
		}
	}
	if ownStored == 0 {
		t.Fatal("no honest node stored mallory's own valid record: the check cannot see stored records")
	}
	if got := find(t, honest[3], "ffn.0"); len(got) != 0 {
		t.Errorf("lookup of ffn.0 returned %+v", got)
	}
	_, _ = victimKey, ownKey
}

// TestAnnounceAloneIsPrompt checks that a node with no peers announces
// at once (keeping the record locally) instead of hanging, and finds its
// own record.
func TestAnnounceAloneIsPrompt(t *testing.T) {
	t.Parallel()
	n := startNode(t, swarm.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	err := n.Announce(ctx, swarm.Record{Name: "solo.0", URLs: []string{"http://solo"}, Expires: time.Now().Add(time.Minute)})
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("Announce with no peers took %v", took)
	}
	if err == nil || !strings.Contains(err.Error(), swarm.ErrNoPeers.Error()) {
		t.Errorf("Announce = %v, want ErrNoPeers", err)
	}
	if got := find(t, n, "solo.0"); len(got) != 1 {
		t.Errorf("own record not found alone: %+v", got)
	}
}

// TestNewNodeListenFails starts a node on a port that is taken: NewNode
// must fail, name the address, and leave nothing running (TestMain).
func TestNewNodeListenFails(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", l.Addr().(*net.TCPAddr).Port)
	n, err := swarm.NewNode(context.Background(), swarm.Config{Listen: []string{addr}})
	if err == nil {
		n.Close()
		t.Fatalf("NewNode on taken %s succeeded", addr)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("NewNode on taken %s = %v, want the address named", addr, err)
	}
	if _, err := swarm.NewNode(context.Background(), swarm.Config{Listen: []string{"/ip4/nonsense"}}); err == nil || !strings.Contains(err.Error(), "/ip4/nonsense") {
		t.Errorf("NewNode on a bad address = %v, want it named", err)
	}
}

func TestNewNodeRejectsBadPeers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, peers := range [][]string{{"not-a-multiaddr"}, {"/ip4/127.0.0.1/tcp/1"}} {
		if n, err := swarm.NewNode(ctx, swarm.Config{InitialPeers: peers}); err == nil {
			n.Close()
			t.Errorf("NewNode(%v) succeeded", peers)
		}
	}
}
