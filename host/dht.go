package host

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/moehost/moehost/host/internal/dht"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/sdk/swarm"
)

// DHTConfig configures the server's DHT node. The zero value joins no one
// (a one-node swarm) on a TCP port of the listen host that it keeps
// across restarts, and announces "http://" (with WithTLS "https://") plus
// the bound address.
type DHTConfig struct {
	// Listen are libp2p multiaddrs to listen on. Default: a TCP port on
	// the host of the server's listen address, the same across restarts
	// (kept in the data dir, so that peers find the server again at the
	// address they hold), or a free one if that is taken, with a warning.
	Listen []string
	// InitialPeers are multiaddrs (with a /p2p/ part) of peers to join
	// the swarm through, e.g. the lines of another server's dht-addrs
	// file. Default none.
	InitialPeers []string
	// Announce are the public base URLs of this server, put in its
	// records. Default "http://" plus the bound address, "https://" with
	// WithTLS; required when
	// the server listens on an unspecified address (0.0.0.0, ::).
	Announce []string
	// StoreBytes bounds what the node stores in the DHT, its own records
	// and others' (strangers' are evicted first, oldest first); PeerBytes
	// bounds one other peer's share. Defaults swarm.DefaultStoreBytes
	// (64 MiB) and swarm.DefaultPeerBytes (4 MiB).
	StoreBytes, PeerBytes int64
}

// WithDHT runs a DHT node in the server: it joins the swarm, announces
// every hosted expert every update period (see WithUpdatePeriod), and
// serves moehost.v1.DiscoveryService. Without it the server runs no DHT
// and is reachable by address only.
func WithDHT(c DHTConfig) Option {
	return optionFunc(func(cfg *config) { cfg.dht = &c })
}

// DHTInfo describes the server's DHT node.
type DHTInfo struct {
	// PeerID is the node's peer ID, kept across restarts in the data dir.
	PeerID string
	// Addrs are its multiaddrs, with the /p2p/ part.
	Addrs []string
	// Peers are the peer IDs in its routing table.
	Peers []string
	// PeerAddrs are the multiaddrs it knows for each of Peers, at most
	// maxPeerAddrs each.
	PeerAddrs map[string][]string
	// URLs are the base URLs its records give for this server.
	URLs []string
	// Records are the names (uids and grid prefixes) it announces.
	Records []string
	// Expiry is how long its records live.
	Expiry time.Duration
}

// DHT describes the server's DHT node; ok is false when it runs none (no
// WithDHT, or not started).
func (s *Server) DHT() (info DHTInfo, ok bool) {
	s.mu.Lock()
	d := s.dht
	s.mu.Unlock()
	if d == nil {
		return DHTInfo{}, false
	}
	info = DHTInfo{PeerID: d.PeerID(), Addrs: d.Addrs(), Peers: d.Peers(), URLs: d.URLs(), Records: d.Names(), Expiry: d.Expiry()}
	info.PeerAddrs = make(map[string][]string, len(info.Peers))
	for _, p := range info.Peers {
		info.PeerAddrs[p] = d.PeerAddrs(p, maxPeerAddrs)
	}
	return info, true
}

// maxPeerAddrs bounds the multiaddrs DHTInfo gives for one peer: a peer
// chooses how many it advertises.
const maxPeerAddrs = 8

// validateDHT checks the DHT settings in New.
func (c *config) validateDHT() error {
	if c.dht == nil {
		return nil
	}
	for _, u := range c.dht.Announce {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return fmt.Errorf("moehost: announce URL %q is not an http:// or https:// URL", u)
		}
	}
	if len(c.dht.Announce) == 0 {
		host, _, err := net.SplitHostPort(c.listen)
		if err != nil {
			return fmt.Errorf("moehost: listen address %q: %w", c.listen, err)
		}
		if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
			return fmt.Errorf("moehost: the server listens on the unspecified address %q, so the DHT needs its public URL: set the announce URLs (--announce)", c.listen)
		}
	}
	return nil
}

// dhtListen is the default DHT listen multiaddr: TCP port 0 on the listen
// host, which the DHT room replaces with the port kept from the last
// start (dht.Config.KeepPort) and hivemind's takes as a free port.
func dhtListen(listen string) []string {
	host, _, _ := net.SplitHostPort(listen)
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip, err := netip.ParseAddr(host)
	switch {
	case err != nil:
		return []string{"/dns/" + host + "/tcp/0"}
	case ip.Is4():
		return []string{"/ip4/" + ip.String() + "/tcp/0"}
	default:
		return []string{"/ip6/" + ip.String() + "/tcp/0"}
	}
}

// startDHT starts the DHT node once the port is bound and the experts are
// loaded; it returns the node's lookups for DiscoveryService to serve, or
// nil without WithDHT.
func (s *Server) startDHT(ctx context.Context) (rpc.Discovery, error) {
	if s.cfg.dht == nil {
		return nil, nil
	}
	c := *s.cfg.dht
	keep := len(c.Listen) == 0 // a port given is kept as given
	if keep {
		c.Listen = dhtListen(s.cfg.listen)
	}
	if len(c.Announce) == 0 {
		c.Announce = []string{s.cfg.scheme() + "://" + s.Addr()}
	}
	period := s.cfg.updatePeriod
	id, err := s.key.get()
	if err != nil {
		return nil, err
	}
	d, err := dht.New(ctx, dht.Config{
		DataDir: s.cfg.dataDir, Listen: c.Listen, KeepPort: keep, InitialPeers: c.InitialPeers, URLs: c.Announce,
		UpdatePeriod: period, Logger: s.log, Registerer: s.prom,
		StoreBytes: c.StoreBytes, PeerBytes: c.PeerBytes, Identity: id,
	}, table{s.experts})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.dht = d
	s.mu.Unlock()
	return d, nil
}

// closeDHT closes the node, if any.
func (s *Server) closeDHT(ctx context.Context) error {
	s.mu.Lock()
	d := s.dht
	s.dht = nil
	s.mu.Unlock()
	if d == nil {
		return nil
	}
	return d.Close(ctx)
}

// withdrawTimeout bounds the withdrawal of the records at shutdown; a
// record whose withdrawal did not reach a peer expires there.
const withdrawTimeout = 2 * time.Second

// stopAnnouncing is the first step of shutdown: it stops announcing and
// withdraws the records, so that clients stop finding the server now
// rather than at the records' expiry.
func (s *Server) stopAnnouncing() {
	s.mu.Lock()
	d := s.dht
	s.mu.Unlock()
	if d != nil {
		ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
		defer cancel()
		_ = d.Withdraw(ctx) // logged; what did not get out expires
	}
}

// DHTExperts lists the hosted experts for the announcer.
func (t table) DHTExperts() []dht.Expert {
	var out []dht.Expert
	for _, e := range t.All() {
		info := e.Info()
		root, step, _ := t.reg.LatestState(info.GetUid())
		out = append(out, dht.Expert{
			UID: info.GetUid(), Digest: info.GetModuleDigest(), StateRoot: root, StateStep: step,
			QueueDepth:       info.GetForwardPool().GetQueueDepth() + info.GetBackwardPool().GetQueueDepth(),
			SamplesPerSecond: info.GetForwardPool().GetSamplesPerSecond(),
		})
	}
	return out
}

var _ dht.Experts = table{}

// The dht room's node answers DiscoveryService's lookups as rpc asks them.
var _ rpc.Discovery = (*dht.Service)(nil)

// WithoutDHT undoes WithDHT: the server runs no DHT.
func WithoutDHT() Option {
	return optionFunc(func(cfg *config) { cfg.dht = nil })
}

// hostKey is the server's libp2p key, loaded from the data dir once, by
// whichever needs it first: the DHT node, or the checkpointer signing a
// state root.
type hostKey struct {
	dataDir string
	once    sync.Once
	id      *swarm.Identity
	err     error
}

func (k *hostKey) get() (*swarm.Identity, error) {
	k.once.Do(func() { k.id, k.err = dht.LoadIdentity(k.dataDir) })
	return k.id, k.err
}

// SignState signs a state root with the host's key (checkpoint.Signer).
func (k *hostKey) SignState(root string) ([]byte, []byte, error) {
	id, err := k.get()
	if err != nil {
		return nil, nil, err
	}
	return id.SignState(root)
}
