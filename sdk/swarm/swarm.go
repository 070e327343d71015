// Package swarm is moehost's DHT as both sides use it: the signed record
// format and its validator, a libp2p Kademlia node (a server's, or a
// client's), lookups and exact beam search over a grid of uids.
//
// One server's entry for one uid (or grid prefix) is one signed record
// under "/moehost/<peer-id>/<name>"; the server also provides the name's
// content ID, so that a lookup finds every peer that announced the name
// (FindProviders) and then reads each peer's record. Records expire; a
// dead server's names vanish once its records do.
//
// The package is used by package host's DHT room and by the Go client
// (sdk/client); it exposes no libp2p type.
package swarm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipfs/go-cid"
	ds "github.com/ipfs/go-datastore"
	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p-kad-dht/records"
	record "github.com/libp2p/go-libp2p-record"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"
)

// ProtocolPrefix is the DHT protocol prefix: moehost's swarm is its own,
// apart from IPFS's.
const ProtocolPrefix = "/moehost"

// DefaultListen is where a node listens when Config.Listen is empty: a
// free TCP port on loopback.
const DefaultListen = "/ip4/127.0.0.1/tcp/0"

// DefaultRedialPeriod is how often a node dials its known peers that it
// is not connected to, by default: as often as a server announces.
const DefaultRedialPeriod = 30 * time.Second

// ErrNoPeers is returned by Announce when the node knows no other peer:
// the record is kept locally and should be announced again later.
var ErrNoPeers = errors.New("no DHT peers to announce to")

// Config configures a Node.
type Config struct {
	// Identity is the node's key; nil makes a fresh one.
	Identity *Identity
	// Listen are the multiaddrs to listen on. Default DefaultListen.
	Listen []string
	// InitialPeers are multiaddrs with a /p2p/ part, of peers to join the
	// swarm through.
	InitialPeers []string
	// Client makes the node a DHT client: it looks up but stores nothing
	// for others (ModeClient). Servers leave it false (ModeServer).
	Client bool
	// ProvideValidity is how long peers keep a provider entry. Liveness
	// comes from record expiry, so this only bounds stale entries.
	// Default 10 minutes.
	ProvideValidity time.Duration

	// StoreBytes bounds what the node stores in the DHT (records and
	// provider entries, its own and others'); PeerBytes bounds one other
	// peer's share. Defaults DefaultStoreBytes and DefaultPeerBytes.
	StoreBytes, PeerBytes int64

	// RedialPeriod is how often the node dials the known peers it is not
	// connected to, by peer ID at the addresses its peerstore holds: its
	// initial peers (always) and the DHT servers it has seen (while the
	// peerstore remembers their addresses, 15 minutes after they went
	// away). A peer that restarted on the same address is found again.
	// Default DefaultRedialPeriod.
	RedialPeriod time.Duration

	// Test hooks: a validator other than Validator, and a datastore the
	// test can read.
	validator record.Validator
	datastore ds.Batching
}

// Node is a libp2p host running a Kademlia DHT in moehost's namespace.
type Node struct {
	id    *Identity
	h     host.Host
	dht   *dht.IpfsDHT
	store *store // nil with a test's datastore
	done  chan struct{}

	// ctx ends at Close; bg counts the goroutines that use it (dials).
	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup

	mu      sync.Mutex
	own     map[string][]byte // name → our latest signed value, served on RecordProtocol
	known   map[peer.ID]bool  // peers to redial; true: an initial peer, kept for good
	dialing map[peer.ID]bool  // redials in flight

	asked atomic.Int64 // RecordProtocol requests served
}

// RecordProtocol is the libp2p protocol on which a node answers, for one
// name, its own latest signed record: a client that learned a provider
// asks it directly, so that peers close to the record's DHT key (a sybil
// eclipse) cannot hide it. Request: a varint-length-prefixed name;
// answer: a varint-length-prefixed signed value, empty if none.
const RecordProtocol = "/moehost/record/1.0.0"

// fetchTimeout bounds one direct record fetch.
const fetchTimeout = 3 * time.Second

// sweepEvery is how often a node frees the records that expired.
const sweepEvery = 5 * time.Second

// NewNode starts a node and connects it to its initial peers. It returns
// once one of them has joined the routing table, and fails only if every
// one of them failed: a dead or hanging initial peer does not hold up the
// others, and is dialed again every RedialPeriod.
func NewNode(ctx context.Context, cfg Config) (*Node, error) {
	id := cfg.Identity
	if id == nil {
		var err error
		if id, err = NewIdentity(); err != nil {
			return nil, err
		}
	}
	listen := cfg.Listen
	if len(listen) == 0 {
		listen = []string{DefaultListen}
	}
	peers := make([]peer.AddrInfo, 0, len(cfg.InitialPeers))
	for _, s := range cfg.InitialPeers {
		ai, err := peer.AddrInfoFromString(s)
		if err != nil {
			return nil, fmt.Errorf("initial peer %q: %w", s, err)
		}
		peers = append(peers, *ai)
	}
	// TCP, Noise and yamux only: no QUIC, relay, NAT traversal or metrics
	// in libp2p's global registry. Servers are reachable hosts.
	addrs := make([]ma.Multiaddr, 0, len(listen))
	for _, s := range listen {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w", s, err)
		}
		addrs = append(addrs, a)
	}
	// The host starts without listening, and listens once it is whole: a
	// listen that fails inside libp2p.New leaves the peerstore's, the
	// resource manager's and the swarm's goroutines running, while
	// h.Close stops them all.
	h, err := libp2p.New(
		libp2p.Identity(id.priv),
		libp2p.NoListenAddrs,
		libp2p.NoTransports,
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableRelay(),
		libp2p.DisableMetrics(),
		libp2p.Ping(false),
	)
	if err != nil {
		return nil, fmt.Errorf("starting libp2p host: %w", err)
	}
	if err := h.Network().Listen(addrs...); err != nil {
		return nil, errors.Join(fmt.Errorf("listening on %v: %w", listen, err), h.Close())
	}
	mode := dht.ModeServer
	if cfg.Client {
		mode = dht.ModeClient
	}
	validity := cfg.ProvideValidity
	if validity <= 0 {
		validity = 10 * time.Minute
	}
	var v record.Validator = Validator{}
	if cfg.validator != nil {
		v = cfg.validator
	}
	opts := []dht.Option{
		dht.Mode(mode),
		dht.ProtocolPrefix(ProtocolPrefix),
		dht.Validator(record.NamespacedValidator{Namespace: v}),
		dht.ProviderManagerOpts(records.ProvideValidity(validity)),
		dht.MaxRecordAge(MaxTTL),
	}
	var st *store
	if cfg.datastore != nil {
		opts = append(opts, dht.Datastore(cfg.datastore))
	} else {
		limit, peerLimit := cfg.StoreBytes, cfg.PeerBytes
		if limit <= 0 {
			limit = DefaultStoreBytes
		}
		if peerLimit <= 0 {
			peerLimit = DefaultPeerBytes
		}
		st = newStore(id.PeerID(), limit, peerLimit)
		opts = append(opts, dht.Datastore(st))
	}
	d, err := dht.New(h, opts...)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("starting DHT: %w", err), h.Close())
	}
	n := &Node{id: id, h: h, dht: d, store: st, done: make(chan struct{}), own: map[string][]byte{},
		known: map[peer.ID]bool{}, dialing: map[peer.ID]bool{}}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	h.SetStreamHandler(RecordProtocol, n.serveRecord)
	if st != nil {
		go n.sweepLoop()
	}
	redial := cfg.RedialPeriod
	if redial <= 0 {
		redial = DefaultRedialPeriod
	}
	n.bg.Go(func() { n.redialLoop(redial) })
	if err := n.connect(ctx, peers); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

// connect dials peers in parallel and keeps them as initial peers (their
// addresses for good in the peerstore, redialed by redialLoop). It returns
// once one of them has joined the routing table, while the others' dials
// go on; it fails only if every dial failed.
func (n *Node) connect(ctx context.Context, peers []peer.AddrInfo) error {
	if len(peers) == 0 {
		return nil
	}
	results := make(chan error, len(peers))
	n.mu.Lock()
	for _, ai := range peers {
		n.h.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.PermanentAddrTTL)
		n.known[ai.ID] = true
	}
	n.mu.Unlock()
	for _, ai := range peers {
		n.bg.Go(func() {
			if err := n.h.Connect(n.ctx, ai); err != nil {
				results <- fmt.Errorf("connecting to initial peer %s: %w", ai.ID, err)
				return
			}
			results <- nil
		})
	}
	// A connected peer enters the routing table once libp2p's identify
	// has confirmed that it speaks our DHT protocol; lookups before that
	// would find no one.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var (
		errs    []error
		timeout <-chan time.Time // from the first connection
	)
	for n.dht.RoutingTable().Size() == 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for initial peers to join the routing table: %w", ctx.Err())
		case <-timeout:
			return errors.New("no initial peer joined the routing table within 10s: do they run moehost's DHT?")
		case err := <-results:
			if err != nil {
				if errs = append(errs, err); len(errs) == len(peers) {
					return errors.Join(errs...)
				}
			} else if timeout == nil {
				timeout = time.After(10 * time.Second)
			}
		case <-tick.C:
		}
	}
	// Fill the routing table in the background; lookups work before.
	go func() { _ = n.dht.Bootstrap(context.WithoutCancel(ctx)) }()
	return nil
}

// redialLoop runs redial every period until Close.
func (n *Node) redialLoop(period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.redial()
		}
	}
}

// redialTimeout bounds one redial of one peer.
const redialTimeout = 10 * time.Second

// redial adds the routing table's peers to the known peers, forgets the
// seen peers whose addresses the peerstore dropped, and dials by peer ID
// each known peer that is neither connected nor being dialed. The dials
// skip libp2p's dial backoff: a peer that was down a period ago may be
// back now.
func (n *Node) redial() {
	ps := n.h.Peerstore()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.dht.RoutingTable().ListPeers() {
		if _, ok := n.known[p]; !ok {
			n.known[p] = false
		}
	}
	for p, initial := range n.known {
		if n.dialing[p] || n.h.Network().Connectedness(p) == network.Connected {
			continue
		}
		if len(ps.Addrs(p)) == 0 {
			if !initial {
				delete(n.known, p)
			}
			continue
		}
		n.dialing[p] = true
		n.bg.Go(func() {
			ctx, cancel := context.WithTimeout(network.WithForceDirectDial(n.ctx, "redial"), redialTimeout)
			_ = n.h.Connect(ctx, peer.AddrInfo{ID: p}) // tried again next period
			cancel()
			n.mu.Lock()
			delete(n.dialing, p)
			n.mu.Unlock()
		})
	}
}

// PeerID returns the node's peer ID.
func (n *Node) PeerID() string { return n.h.ID().String() }

// Identity returns the node's identity.
func (n *Node) Identity() *Identity { return n.id }

// Addrs returns the node's multiaddrs with its /p2p/ part, which other
// nodes take as initial peers.
func (n *Node) Addrs() []string {
	self := ma.StringCast("/p2p/" + n.h.ID().String())
	var out []string
	for _, a := range n.h.Addrs() {
		out = append(out, a.Encapsulate(self).String())
	}
	sort.Strings(out)
	return out
}

// Peers returns the peers in the node's routing table, sorted.
func (n *Node) Peers() []string {
	var out []string
	for _, p := range n.dht.RoutingTable().ListPeers() {
		out = append(out, p.String())
	}
	sort.Strings(out)
	return out
}

// PeerAddrs returns the multiaddrs the node's peerstore holds for the peer
// id, sorted, at most limit of them (a peer chooses what it advertises);
// none for an id that does not parse.
func (n *Node) PeerAddrs(id string, limit int) []string {
	p, err := peer.Decode(id)
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range n.h.Peerstore().Addrs(p) {
		out = append(out, a.String())
	}
	sort.Strings(out)
	return out[:min(len(out), max(limit, 0))]
}

// StoredRecords returns the live records the node's DHT store holds, its
// own and those other nodes put there, of the first limit names in name
// order, and how many it holds in all. In a swarm no larger than the
// DHT's replication factor (20) that is every record; in a larger one, a
// share of them, and Find looks up the rest.
func (n *Node) StoredRecords(limit int) ([]Record, int) {
	if n.store == nil {
		return nil, 0
	}
	return n.store.records(limit)
}

// Connect joins the node to more peers (multiaddrs with a /p2p/ part),
// which it then redials as it does its initial peers.
func (n *Node) Connect(ctx context.Context, addrs ...string) error {
	peers := make([]peer.AddrInfo, 0, len(addrs))
	for _, s := range addrs {
		ai, err := peer.AddrInfoFromString(s)
		if err != nil {
			return fmt.Errorf("peer %q: %w", s, err)
		}
		peers = append(peers, *ai)
	}
	return n.connect(ctx, peers)
}

// Close stops the dials, the DHT and the libp2p host.
func (n *Node) Close() error {
	close(n.done)
	n.cancel()
	n.bg.Wait()
	return errors.Join(n.dht.Close(), n.h.Close())
}

// sweepLoop frees expired records until Close.
func (n *Node) sweepLoop() {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			n.store.sweep()
		}
	}
}

// StoreStats describes what the node stores in the DHT.
func (n *Node) StoreStats() StoreStats {
	if n.store == nil {
		return StoreStats{}
	}
	return n.store.Stats()
}

// contentID is the DHT content ID that servers of name provide.
func contentID(name string) cid.Cid {
	sum, err := mh.Sum([]byte("moehost:"+name), mh.SHA2_256, -1)
	if err != nil {
		panic("BUG: sha2-256 multihash: " + err.Error())
	}
	return cid.NewCidV1(cid.Raw, sum)
}

// Announce signs r with the node's identity, stores it in the DHT and
// provides its name. With no peers it keeps the record locally and
// returns ErrNoPeers at once.
func (n *Node) Announce(ctx context.Context, r Record) error {
	if !ValidName(r.Name) {
		return fmt.Errorf("%w: name %q is not a valid uid or prefix", ErrInvalidRecord, r.Name)
	}
	value, err := n.id.Sign(r)
	if err != nil {
		return err
	}
	if _, err := Decode(Key(n.PeerID(), r.Name), value, time.Now()); err != nil {
		return err
	}
	n.mu.Lock()
	n.own[r.Name] = value
	n.mu.Unlock()
	alone := n.dht.RoutingTable().Size() == 0
	putErr := n.dht.PutValue(ctx, Key(n.PeerID(), r.Name), value)
	provErr := n.dht.Provide(ctx, contentID(r.Name), !alone)
	if alone {
		return fmt.Errorf("announcing %q: %w", r.Name, ErrNoPeers)
	}
	if err := errors.Join(putErr, provErr); err != nil {
		return fmt.Errorf("announcing %q: %w", r.Name, err)
	}
	return nil
}

// Withdraw replaces our records of names with empty ones (no URL, no
// child) that outlive them by a millisecond, so that peers holding a
// record select the withdrawal instead and lookups drop the name at once
// rather than at its expiry. A graceful shutdown calls it.
func (n *Node) Withdraw(ctx context.Context, names []string) error {
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, name := range names {
		key := Key(n.PeerID(), name)
		n.mu.Lock()
		old := n.own[name]
		n.mu.Unlock()
		r, err := Decode(key, old, time.Now())
		if err != nil || !r.Live() {
			continue // nothing live to withdraw
		}
		value, err := n.id.Sign(Record{Name: name, Expires: r.Expires.Add(time.Millisecond)})
		if err != nil {
			return err
		}
		n.mu.Lock()
		n.own[name] = value
		n.mu.Unlock()
		wg.Go(func() {
			if err := n.dht.PutValue(ctx, key, value); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("withdrawing %q: %w", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Find returns every live record of name, one per announcing peer, sorted
// by peer ID.
func (n *Node) Find(ctx context.Context, name string) ([]Record, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("%q is not a valid uid or prefix", name)
	}
	var (
		mu   sync.Mutex
		out  []Record
		seen = map[string]bool{}
		wg   sync.WaitGroup
	)
	add := func(r Record) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[r.PeerID] {
			seen[r.PeerID] = true
			out = append(out, r)
		}
	}
	// The providers that the DHT knows, and, on a path of their own, the
	// moehost peers this node is connected to: sybils gathered around a
	// name's key can keep its provider records from this node, but not
	// the record of a host it talks to directly. Each peer is asked once:
	// a connected provider's DHT path waits for the direct answer, and
	// looks further only when that held no record.
	direct := map[peer.ID]*directAsk{}
	for _, p := range n.directPeers(maxDirectAsks) {
		d := &directAsk{done: make(chan struct{})}
		direct[p] = d
		wg.Go(func() {
			defer close(d.done)
			fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
			v, err := n.fetch(fctx, p, name)
			cancel()
			if err != nil || len(v) == 0 {
				return // no record of the name there
			}
			r, err := Decode(Key(p.String(), name), v, time.Now())
			if err != nil {
				return
			}
			d.answered = true
			if r.Live() {
				add(r)
			}
		})
	}
	for ai := range n.dht.FindProvidersAsync(ctx, contentID(name), 0) {
		if ai.ID != n.h.ID() && len(ai.Addrs) > 0 {
			n.h.Peerstore().AddAddrs(ai.ID, ai.Addrs, time.Minute)
		}
		d := direct[ai.ID]
		wg.Go(func() {
			if d != nil {
				if <-d.done; d.answered {
					return // the direct path has its record
				}
			}
			r, ok := n.recordOf(ctx, ai.ID, name, d != nil)
			if !ok || !r.Live() {
				return // expired, withdrawn, never stored or unreachable
			}
			add(r)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("looking up %q: %w", name, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PeerID < out[j].PeerID })
	return out, nil
}

// directAsk is Find's direct fetch from one connected peer: answered, once
// done is closed, says whether the peer sent a record of the name.
type directAsk struct {
	done     chan struct{}
	answered bool
}

// maxDirectAsks bounds the connected peers one Find asks directly.
const maxDirectAsks = 8

// directPeers returns up to max peers this node is connected to that
// serve RecordProtocol (moehost servers, as identify told us).
func (n *Node) directPeers(max int) []peer.ID {
	var out []peer.ID
	ps := n.h.Peerstore()
	for _, p := range n.h.Network().Peers() {
		if len(out) == max {
			break
		}
		if ok, err := ps.SupportsProtocols(p, RecordProtocol); err == nil && len(ok) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// recordOf returns provider p's record of name: asked of p itself over
// RecordProtocol (unless asked: Find asked p already), or, if p cannot be
// reached or holds none, read from the DHT. A value
// that fails validation is ignored, never taken as the provider's answer.
func (n *Node) recordOf(ctx context.Context, p peer.ID, name string, asked bool) (Record, bool) {
	key := Key(p.String(), name)
	var v []byte
	switch {
	case p == n.h.ID():
		n.mu.Lock()
		v = n.own[name]
		n.mu.Unlock()
	case asked:
		// Find asked p directly already.
	default:
		fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
		v, _ = n.fetch(fctx, p, name)
		cancel()
	}
	if len(v) > 0 {
		if r, err := Decode(key, v, time.Now()); err == nil {
			return r, true
		}
	}
	v, err := n.dht.GetValue(ctx, key, dht.Quorum(1))
	if err != nil {
		return Record{}, false
	}
	r, err := Decode(key, v, time.Now())
	return r, err == nil
}

// fetch asks peer p for its own record of name over RecordProtocol.
func (n *Node) fetch(ctx context.Context, p peer.ID, name string) ([]byte, error) {
	s, err := n.h.NewStream(ctx, p, RecordProtocol)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	if err := msgio.NewVarintWriter(s).WriteMsg([]byte(name)); err != nil {
		_ = s.Reset()
		return nil, err
	}
	v, err := msgio.NewVarintReaderSize(s, MaxRecordSize).ReadMsg()
	if err != nil {
		_ = s.Reset()
		return nil, err
	}
	return v, nil
}

// serveRecord answers one RecordProtocol request.
func (n *Node) serveRecord(s network.Stream) {
	defer s.Close()
	n.asked.Add(1)
	_ = s.SetDeadline(time.Now().Add(fetchTimeout))
	name, err := msgio.NewVarintReaderSize(s, MaxNameLen).ReadMsg()
	if err != nil {
		_ = s.Reset()
		return
	}
	n.mu.Lock()
	v := n.own[string(name)]
	n.mu.Unlock()
	if err := msgio.NewVarintWriter(s).WriteMsg(v); err != nil {
		_ = s.Reset()
	}
}

// FindMany looks names up in parallel.
func (n *Node) FindMany(ctx context.Context, names []string) (map[string][]Record, error) {
	return findMany(ctx, names, n.Find)
}

// findMany runs find for each name, a few at a time.
func findMany(ctx context.Context, names []string, find func(context.Context, string) ([]Record, error)) (map[string][]Record, error) {
	out := make(map[string][]Record, len(names))
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, 32)
	)
	for _, name := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			recs, err := find(ctx, name)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			out[name] = recs
		})
	}
	wg.Wait()
	return out, first
}

// Stream is one libp2p stream of a protocol served beside the DHT (the
// blob protocol): bytes both ways, a deadline, and Reset to abort.
type Stream interface {
	io.ReadWriteCloser
	Reset() error
	SetDeadline(time.Time) error
}

// HandleStream serves protocol on the node's host: fn gets each stream
// a peer opens, with the peer's ID. Each stream is accounted in the
// resource manager's scope of a service named after the protocol.
func (n *Node) HandleStream(proto string, fn func(peer string, s Stream)) {
	n.h.SetStreamHandler(protocol.ID(proto), func(s network.Stream) {
		if err := s.Scope().SetService(proto); err != nil {
			_ = s.Reset()
			return
		}
		fn(s.Conn().RemotePeer().String(), s)
	})
}

// OpenStream opens a stream of protocol to peer (a peer ID), dialing it
// at the addresses the node knows.
func (n *Node) OpenStream(ctx context.Context, peerID, proto string) (Stream, error) {
	p, err := peer.Decode(peerID)
	if err != nil {
		return nil, fmt.Errorf("peer %q: %w", peerID, err)
	}
	s, err := n.h.NewStream(ctx, p, protocol.ID(proto))
	if err != nil {
		return nil, err
	}
	return s, nil
}
