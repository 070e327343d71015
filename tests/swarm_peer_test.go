package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-msgio/pbio"

	"github.com/moehost/moehost/sdk/swarm"
)

// adversarial scales the swarm tests' attacks up (more strangers, more
// rounds): `make test-swarm-adversarial` sets MOEHOST_ADVERSARIAL=1.
func adversarial(quick, long int) int {
	if os.Getenv("MOEHOST_ADVERSARIAL") != "" {
		return long
	}
	return quick
}

// kadProtocol is moehost's Kademlia protocol, which outside peers speak.
const kadProtocol = protocol.ID(swarm.ProtocolPrefix + "/kad/1.0.0")

// outsider is a peer written against the record format and the DHT wire
// protocol alone: a real libp2p host that sends Kademlia messages of its
// choosing straight to a server.
type outsider struct {
	id *swarm.Identity
	h  host.Host
}

func newOutsider(t *testing.T, id *swarm.Identity) *outsider {
	t.Helper()
	if id == nil {
		var err error
		if id, err = swarm.NewIdentity(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := id.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(priv), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.NoTransports, libp2p.Transport(tcp.NewTCPTransport), libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport), libp2p.DisableRelay(), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &outsider{id: id, h: h}
}

// send sends one Kademlia message to the peer at addr (a multiaddr with
// /p2p/) and returns its answer.
func (o *outsider) send(ctx context.Context, addr string, msg *dhtpb.Message) (*dhtpb.Message, error) {
	ai, err := peer.AddrInfoFromString(addr)
	if err != nil {
		return nil, err
	}
	if err := o.h.Connect(ctx, *ai); err != nil {
		return nil, err
	}
	s, err := o.h.NewStream(ctx, ai.ID, kadProtocol)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if d, ok := ctx.Deadline(); ok {
		s.SetDeadline(d)
	}
	if err := pbio.NewDelimitedWriter(s).WriteMsg(msg); err != nil {
		return nil, err
	}
	var res dhtpb.Message
	if err := pbio.NewDelimitedReader(s, 4<<20).ReadMsg(&res); err != nil {
		return nil, err
	}
	return &res, nil
}

// notify sends a Kademlia message that gets no answer (ADD_PROVIDER).
func (o *outsider) notify(ctx context.Context, addr string, msg *dhtpb.Message) error {
	ai, err := peer.AddrInfoFromString(addr)
	if err != nil {
		return err
	}
	if err := o.h.Connect(ctx, *ai); err != nil {
		return err
	}
	s, err := o.h.NewStream(ctx, ai.ID, kadProtocol)
	if err != nil {
		return err
	}
	defer s.Close()
	return pbio.NewDelimitedWriter(s).WriteMsg(msg)
}

// put sends a signed record of the outsider's straight to the peer at addr.
func (o *outsider) put(ctx context.Context, addr string, r swarm.Record) error {
	v, err := o.id.Sign(r)
	if err != nil {
		return err
	}
	key := []byte(swarm.Key(o.id.PeerID(), r.Name))
	msg := dhtpb.NewMessage(dhtpb.Message_PUT_VALUE, key, 0)
	msg.Record = &recpb.Record{Key: key, Value: v}
	_, err = o.send(ctx, addr, msg)
	return err
}

// get asks the peer at addr for the value it stores under key; nil if none.
func (o *outsider) get(ctx context.Context, addr, key string) ([]byte, error) {
	res, err := o.send(ctx, addr, dhtpb.NewMessage(dhtpb.Message_GET_VALUE, []byte(key), 0))
	if err != nil {
		return nil, err
	}
	return res.GetRecord().GetValue(), nil
}

// metric reads one unlabelled metric of a server's /metrics.
func metric(t *testing.T, baseURL, name string) float64 {
	t.Helper()
	res, err := http.Get(baseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// rssBytes is a process's resident set.
func rssBytes(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VmRSS")
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// TestSwarmStoreBounded floods a real `moehost serve` with records from
// outside peers: a record with a 1 MB digest is refused; a valid record is
// no longer served past its signed expiry; and a flood of valid records
// from 100 strangers (1,000 in make test-swarm-adversarial) leaves the server's DHT store within its bound (1 MiB
// here) with its own records kept.
func TestSwarmStoreBounded(t *testing.T) {
	t.Parallel()
	const bound = 1 << 20
	a := serve(t, "--experts", "ffn.[0:2]", "--update-period", "1s", "--dht-store-bytes", strconv.Itoa(bound), "--dht-peer-bytes", "65536")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := newOutsider(t, nil)
	addr := a.addrs[0]
	apeer := addr[strings.LastIndex(addr, "/")+1:]

	// Oversized fields.
	if err := o.put(ctx, addr, swarm.Record{Name: "ffn.0", URLs: []string{"http://127.0.0.1:1"}, Digest: strings.Repeat("a", 1<<20), Expires: time.Now().Add(time.Minute)}); err == nil {
		if v, _ := o.get(ctx, addr, swarm.Key(o.id.PeerID(), "ffn.0")); v != nil {
			t.Error("the server stores a record with a 1 MB digest")
		}
	}

	// Signed expiry.
	if err := o.put(ctx, addr, swarm.Record{Name: "ffn.1", URLs: []string{"http://127.0.0.1:1"}, Expires: time.Now().Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if v, err := o.get(ctx, addr, swarm.Key(o.id.PeerID(), "ffn.1")); err != nil || v == nil {
		t.Fatalf("a valid record was not stored: %v", err)
	}
	time.Sleep(2500 * time.Millisecond)
	if v, _ := o.get(ctx, addr, swarm.Key(o.id.PeerID(), "ffn.1")); v != nil {
		t.Error("the server serves a record past its signed expiry")
	}

	// Flood: 100 strangers, each storing records of about 4.5 KB until the
	// server refuses it.
	rss := rssBytes(t, a.cmd.Process.Pid)
	begin := time.Now()
	urls := make([]string, swarm.MaxURLs)
	for i := range urls {
		urls[i] = "http://127.0.0.1:1/" + strings.Repeat("x", swarm.MaxURLLen-20)
	}
	put := 0
	for range adversarial(100, 1000) {
		s := newOutsider(t, nil)
		for i := range 32 {
			if err := s.put(ctx, addr, swarm.Record{Name: fmt.Sprintf("ffn.%d", i), URLs: urls, Expires: time.Now().Add(time.Hour)}); err != nil {
				break
			}
			put++
		}
		s.h.Close()
	}
	took := time.Since(begin)
	held := metric(t, a.url, "moehost_dht_store_bytes")
	grew := rssBytes(t, a.cmd.Process.Pid) - rss
	t.Logf("flood: %d records of ~4.5 KB stored in %v; the store holds %.0f bytes (bound %d, evicted %.0f, refused %.0f); RSS grew %d KB",
		put, took.Round(time.Millisecond), held, bound, metric(t, a.url, "moehost_dht_store_evicted_total"), metric(t, a.url, "moehost_dht_store_refused_total"), grew>>10)
	if held > bound {
		t.Errorf("the store holds %.0f bytes, more than its bound %d", held, bound)
	}
	if put*4500 < 2*bound {
		t.Errorf("only %d records were accepted: the flood did not test the bound", put)
	}
	for _, uid := range []string{"ffn.0", "ffn.1", "ffn."} {
		if v, err := o.get(ctx, addr, swarm.Key(apeer, uid)); err != nil || v == nil {
			t.Errorf("the server lost its own record of %s to the flood (%v)", uid, err)
		}
	}
}
