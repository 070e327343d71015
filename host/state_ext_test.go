package host_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/sdk/client"
	"github.com/moehost/moehost/sdk/swarm"
)

// TestRecordCarriesStateRoot trains an expert, lets the periodic saver
// write its checkpoint, and checks that the uid's DHT record, as another
// node finds it, names that checkpoint's state root and step, and that
// the manifest on disk is signed by the server's key.
func TestRecordCarriesStateRoot(t *testing.T) {
	t.Parallel()
	const h = 8
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := ckptServer(t, dir, wasmexperts.FFN, h, host.CheckpointConfig{},
		host.WithDHT(host.DHTConfig{}), host.WithUpdatePeriod(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	c := client.New(srv.Addr())
	defer c.Close()
	train(t, c, h, 3, rand.New(rand.NewPCG(3, 4)))
	info, _ := srv.DHT()
	node, err := swarm.NewNode(ctx, swarm.Config{Client: true, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, InitialPeers: info.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	st, err := checkpoint.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for {
		recs, _ := node.Find(ctx, "ffn.0")
		if len(recs) == 1 && recs[0].StateStep == 3 {
			sm, err := st.Manifest("ffn.0", 3)
			if err != nil {
				t.Fatal(err)
			}
			if recs[0].StateRoot != sm.Root {
				t.Fatalf("record's state root %s, the manifest's %s", recs[0].StateRoot, sm.Root)
			}
			signer, err := swarm.VerifyState(sm.Root, sm.PublicKey, sm.Signature)
			if err != nil || signer != info.PeerID {
				t.Fatalf("manifest signed by %q (%v), want the server %s", signer, err, info.PeerID)
			}
			if files, _ := filepath.Glob(filepath.Join(dir, "ffn.0", "3.*")); len(files) != 3 {
				t.Errorf("step 3's files: %v", files)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no record with step 3's state: %+v", recs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
