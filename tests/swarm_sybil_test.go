package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	kb "github.com/libp2p/go-libp2p-kbucket"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio/pbio"
	mh "github.com/multiformats/go-multihash"

	"github.com/moehost/moehost/sdk/client"
	"github.com/moehost/moehost/sdk/swarm"
)

// sybil makes an outsider answer Kademlia dishonestly: every lookup
// hears only of the other sybils, every GET_VALUE gets a forged record,
// and stores are acknowledged and dropped.
func (o *outsider) sybil(all *[]peer.AddrInfo) {
	o.h.SetStreamHandler(kadProtocol, func(s network.Stream) {
		defer s.Close()
		r, w := pbio.NewDelimitedReader(s, 4<<20), pbio.NewDelimitedWriter(s)
		for {
			var m dhtpb.Message
			if err := r.ReadMsg(&m); err != nil {
				return
			}
			res := dhtpb.NewMessage(m.GetType(), m.GetKey(), 0)
			switch m.GetType() {
			case dhtpb.Message_ADD_PROVIDER:
				continue // no answer expected
			case dhtpb.Message_GET_VALUE:
				forged := make([]byte, 200)
				rand.Read(forged)
				res.Record = &recpb.Record{Key: m.GetKey(), Value: forged}
			case dhtpb.Message_PUT_VALUE:
				res = &m
			}
			if m.GetType() != dhtpb.Message_PUT_VALUE && m.GetType() != dhtpb.Message_PING {
				res.CloserPeers = dhtpb.RawPeerInfosToPBPeers(*all)
			}
			if err := w.WriteMsg(res); err != nil {
				return
			}
		}
	})
}

// TestSwarmSybilEclipse surrounds the DHT key of server A's record of
// ffn.0 with 20 sybils (peer ids sharing 10 leading bits with it) that
// answer dishonestly, so that A's re-announcements reach only them and
// B's copy of A's record expires. Discovery through B must still find A
// for ffn.0 every time: B learns A as a provider and asks A for its own
// record directly.
func TestSwarmSybilEclipse(t *testing.T) {
	t.Parallel()
	a := serve(t, "--experts", "ffn.[0:2]", "--update-period", "1s")
	b := serve(t, "--experts", "ffn.[1:3]", "--update-period", "1s", "--initial-peers", a.addrs[0])
	apeer := a.addrs[0][strings.LastIndex(a.addrs[0], "/")+1:]
	target := kb.ConvertKey(swarm.Key(apeer, "ffn.0"))
	// The attack's premise: B has learned A as a provider of ffn.0 before
	// the sybils gather around its key. Under load A's first announcement
	// can come after they do, and then it reaches only them (a record
	// published into an eclipse already in place; see the notes of the
	// swarm issue).
	dc := client.NewDiscoveryClient(b.url)
	defer dc.Close()
	waitFor(t, time.Minute, "A found for ffn.0 through B", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		found, err := dc.Discover(ctx, []string{"ffn.0"})
		return err == nil && slices.Contains(urlsOf(found["ffn.0"]), a.url), fmt.Sprint(urlsOf(found["ffn.0"]), err)
	})

	var sybils []*outsider
	var all []peer.AddrInfo
	for tries := 0; len(sybils) < 20; tries++ {
		id, err := swarm.NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := peer.Decode(id.PeerID())
		if kb.CommonPrefixLen(kb.ConvertPeerID(pid), target) < 10 {
			continue
		}
		o := newOutsider(t, id)
		o.sybil(&all)
		sybils = append(sybils, o)
		all = append(all, peer.AddrInfo{ID: o.h.ID(), Addrs: o.h.Addrs()})
	}
	// Each round sleeps half a second: the context outlives every round
	// (the long run's 240 rounds alone took its 2 minutes).
	rounds := adversarial(24, 240)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(rounds)*time.Second)
	defer cancel()
	for _, o := range sybils {
		for _, s := range []*served{a, b} {
			if _, err := o.send(ctx, s.addrs[0], dhtpb.NewMessage(dhtpb.Message_PING, nil, 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range []*served{a, b} {
		waitFor(t, 30*time.Second, "the sybils in the routing table", func() (bool, string) {
			n := metric(t, s.url, "moehost_dht_peers")
			return n >= 15, fmt.Sprintf("%.0f peers", n)
		})
	}

	// B's copy of A's record (3 s expiry) is gone after a few seconds; A
	// must be found throughout.
	misses := 0
	for i := range rounds {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		found, err := dc.Discover(lctx, []string{"ffn.0"})
		cancel()
		if err != nil || !slices.Contains(urlsOf(found["ffn.0"]), a.url) {
			misses++
			t.Logf("round %d: ffn.0 found at %v (%v)", i, urlsOf(found["ffn.0"]), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if misses > 0 {
		t.Errorf("A was hidden from discovery through B in %d of %d rounds", misses, rounds)
	}

	// The attacker also serves ffn.0 (allowed: many hosts may serve one
	// uid), with A's digest. Pinning A's host key keeps it out.
	attacker := sybils[0]
	if err := attacker.put(ctx, b.addrs[0], swarm.Record{Name: "ffn.0", URLs: []string{"http://127.0.0.1:9"}, Expires: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	cid, _ := mh.Sum([]byte("moehost:ffn.0"), mh.SHA2_256, -1)
	prov := dhtpb.NewMessage(dhtpb.Message_ADD_PROVIDER, cid, 0)
	prov.ProviderPeers = dhtpb.RawPeerInfosToPBPeers([]peer.AddrInfo{{ID: attacker.h.ID(), Addrs: attacker.h.Addrs()}})
	attacker.notify(ctx, b.addrs[0], prov)
	discover := func(args ...string) string {
		out, _ := exec.Command(moehostBinary(t), append([]string{"discover", "--server", b.url}, args...)...).Output()
		return string(out)
	}
	waitFor(t, 10*time.Second, "the attacker's record found", func() (bool, string) {
		out := discover("ffn.0")
		return strings.Contains(out, "http://127.0.0.1:9\t"), out
	})
	if out := discover("--trust", apeer, "ffn.0"); out != "ffn.0\t"+a.url+"\t"+apeer+"\n" {
		t.Errorf("discover --trust A printed %q, want A's endpoint only", out)
	}
}
