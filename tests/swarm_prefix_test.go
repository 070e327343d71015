package tests

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	mh "github.com/multiformats/go-multihash"

	"github.com/moehost/moehost/sdk/swarm"
)

// TestSwarmPrefixFlood has 10 outside peers announce, through server B,
// prefix records for ffn. that list 1,024 children each that nobody
// hosts. `moehost discover ffn.` through B must still print the three
// real experts, from the first pages, within 3 s (the whole expansion takes longer).
func TestSwarmPrefixFlood(t *testing.T) {
	t.Parallel()
	a := serve(t, "--experts", "ffn.[0:2]", "--update-period", "1s")
	b := serve(t, "--experts", "ffn.[1:3]", "--update-period", "1s", "--initial-peers", a.addrs[0])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cid, _ := mh.Sum([]byte("moehost:ffn."), mh.SHA2_256, -1)
	for i := range adversarial(10, 64) {
		o := newOutsider(t, nil)
		kids := make([]int32, swarm.MaxChildren)
		for j := range kids {
			kids[j] = int32(1000 + i*swarm.MaxChildren + j)
		}
		if err := o.put(ctx, b.addrs[0], swarm.Record{Name: "ffn.", Children: kids, Expires: time.Now().Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		prov := dhtpb.NewMessage(dhtpb.Message_ADD_PROVIDER, cid, 0)
		prov.ProviderPeers = dhtpb.RawPeerInfosToPBPeers([]peer.AddrInfo{{ID: o.h.ID(), Addrs: o.h.Addrs()}})
		if err := o.notify(ctx, b.addrs[0], prov); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"ffn.0\t" + a.url, "ffn.1\t" + a.url, "ffn.1\t" + b.url, "ffn.2\t" + b.url}
	var out []byte
	waitFor(t, 20*time.Second, "discover ffn. through B prints every real expert within 3 s", func() (bool, string) {
		begin := time.Now()
		cmd := exec.Command(moehostBinary(t), "discover", "--server", b.url, "--timeout", "3s", "ffn.")
		out, _ = cmd.Output()
		took := time.Since(begin)
		for _, w := range want {
			if !strings.Contains(string(out), w+"\t") {
				return false, string(out) + " after " + took.String()
			}
		}
		t.Logf("discover printed the real experts in %v", took.Round(time.Millisecond))
		return true, ""
	})
}
