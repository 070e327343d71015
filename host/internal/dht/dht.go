// Package dht is the host's room for the DHT: it runs the server's libp2p
// Kademlia node (package sdk/swarm), announces the hosted experts every
// update period, counts what it does in the server's Prometheus registry,
// and answers the lookups of moehost.v1.DiscoveryService (Find, Beam),
// which package rpc serves.
//
// It knows the experts only through the small [Experts] interface, which
// package host implements.
package dht

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moehost/moehost/internal/atomicfile"
	"github.com/moehost/moehost/sdk/swarm"
)

// DefaultUpdatePeriod is how often experts are announced by default.
const DefaultUpdatePeriod = 30 * time.Second

// MinExpiry is the shortest record lifetime: records live max(2×update
// period, MinExpiry).
const MinExpiry = 3 * time.Second

// Names of the files the service keeps in its data dir.
const (
	KeyFile   = "dht-key"
	AddrsFile = "dht-addrs"
	PortFile  = "dht-port"
)

// Expert is what is announced of one hosted expert.
type Expert struct {
	UID    string
	Digest string
	// StateRoot and StateStep name the expert's latest checkpoint ("":
	// none).
	StateRoot        string
	StateStep        int64
	QueueDepth       int64
	SamplesPerSecond float64
}

// Experts lists the hosted experts at announce time.
type Experts interface {
	DHTExperts() []Expert
}

// Config configures the service.
type Config struct {
	// DataDir holds the identity key (KeyFile), so that a restart keeps
	// the peer ID, the multiaddrs (AddrsFile), and with KeepPort the TCP
	// port (PortFile). Required.
	DataDir string
	// Listen are multiaddrs to listen on. Default swarm.DefaultListen.
	Listen []string
	// KeepPort puts the TCP port of the last start, kept in PortFile, in
	// place of port 0 in Listen, so that a restart keeps the multiaddrs
	// that peers hold (dht-addrs). If that port is taken, the node takes
	// a fresh one and logs a warning. Default false: port 0 is a fresh
	// port at every start.
	KeepPort bool
	// InitialPeers are multiaddrs (with /p2p/) of peers to join through.
	InitialPeers []string
	// URLs are the server's public base URLs, put in every record.
	// Required.
	URLs []string
	// UpdatePeriod is how often the experts are announced. Default
	// DefaultUpdatePeriod.
	UpdatePeriod time.Duration
	// Logger logs; nil discards.
	Logger *slog.Logger
	// Registerer receives the DHT metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// StoreBytes and PeerBytes bound the node's DHT store: see
	// swarm.Config.
	StoreBytes, PeerBytes int64
	// Identity is the node's key; nil loads it from DataDir
	// (LoadIdentity).
	Identity *swarm.Identity
}

// Service is the server's DHT node and announcer.
type Service struct {
	cfg     Config
	log     *slog.Logger
	experts Experts
	node    *swarm.Node
	metrics *metrics

	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped chan struct{}
	names   []string // announced in the last round
}

// New starts the node (loading or creating its identity in the data dir),
// and writes its multiaddrs to the data dir. It does not announce yet.
func New(ctx context.Context, cfg Config, experts Experts) (*Service, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("dht: no data dir")
	}
	if len(cfg.URLs) == 0 {
		return nil, errors.New("dht: no public URL to announce")
	}
	if cfg.UpdatePeriod <= 0 {
		cfg.UpdatePeriod = DefaultUpdatePeriod
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	id := cfg.Identity
	if id == nil {
		var err error
		if id, err = LoadIdentity(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	listen := cfg.Listen
	if cfg.KeepPort {
		listen = keptListen(log, filepath.Join(cfg.DataDir, PortFile), listen)
	}
	// Known peers are redialed as often as the experts are announced, so
	// that a restarted peer is back within an update period.
	node, err := swarm.NewNode(ctx, swarm.Config{Identity: id, Listen: listen, InitialPeers: cfg.InitialPeers,
		StoreBytes: cfg.StoreBytes, PeerBytes: cfg.PeerBytes, RedialPeriod: cfg.UpdatePeriod})
	if err != nil {
		return nil, fmt.Errorf("dht: %w", err)
	}
	s := &Service{cfg: cfg, log: log, experts: experts, node: node}
	s.metrics = newMetrics(cfg.Registerer, func() float64 { return float64(len(node.Peers())) }, node.StoreStats)
	addrs := node.Addrs()
	if err := atomicfile.Write(filepath.Join(cfg.DataDir, AddrsFile), []byte(strings.Join(addrs, "\n")+"\n")); err != nil {
		return nil, errors.Join(fmt.Errorf("dht: writing %s: %w", AddrsFile, err), s.Close(ctx))
	}
	if port := tcpPort(addrs); cfg.KeepPort && port != "" {
		if err := atomicfile.Write(filepath.Join(cfg.DataDir, PortFile), []byte(port+"\n")); err != nil {
			return nil, errors.Join(fmt.Errorf("dht: writing %s: %w", PortFile, err), s.Close(ctx))
		}
	}
	log.Info("dht node up", "peer", node.PeerID(), "addrs", strings.Join(addrs, ","))
	return s, nil
}

// anyPort matches a listen multiaddr on TCP port 0, which KeepPort
// replaces: its first group is the host part, its second the host.
var anyPort = regexp.MustCompile(`^(/(?:ip4|ip6|dns|dns4|dns6)/([^/]+)/tcp/)0$`)

// boundPort matches the TCP port of a bound multiaddr.
var boundPort = regexp.MustCompile(`/tcp/([0-9]+)(?:/|$)`)

// keptListen returns listen with port 0 replaced by the port kept in
// path, where there is one and it is free; a port that is taken (another
// process took it while the server was down) is logged, and port 0 kept.
// Whether it is free is asked of the kernel just before the node listens.
func keptListen(log *slog.Logger, path string, listen []string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("dht: the kept DHT port cannot be read; listening on a fresh one", "file", path, "err", err)
		}
		return listen
	}
	port, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 16)
	if err != nil || port == 0 {
		log.Warn("dht: the kept DHT port is not a port; listening on a fresh one", "file", path, "content", strings.TrimSpace(string(b)))
		return listen
	}
	out := slices.Clone(listen)
	for i, a := range listen {
		m := anyPort.FindStringSubmatch(a)
		if m == nil {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(m[2], strconv.FormatUint(port, 10)))
		if err != nil {
			log.Warn("dht: the DHT port of the last start is taken; listening on a fresh one, so peers that joined through the old address must be given the new dht-addrs",
				"port", port, "err", err)
			continue
		}
		_ = l.Close()
		out[i] = m[1] + strconv.FormatUint(port, 10)
	}
	return out
}

// tcpPort returns the TCP port of the first of addrs that has one, or "".
func tcpPort(addrs []string) string {
	for _, a := range addrs {
		if m := boundPort.FindStringSubmatch(a); m != nil {
			return m[1]
		}
	}
	return ""
}

// LoadIdentity reads the node's key (KeyFile) in dataDir, or makes one
// and writes it there.
func LoadIdentity(dataDir string) (*swarm.Identity, error) {
	return loadIdentity(filepath.Join(dataDir, KeyFile))
}

// loadIdentity reads the key at path, or makes one and writes it there.
func loadIdentity(path string) (*swarm.Identity, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		id, err := swarm.ParseIdentity(b)
		if err != nil {
			return nil, fmt.Errorf("dht: %s: %w", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("dht: reading key: %w", err)
	}
	id, err := swarm.NewIdentity()
	if err != nil {
		return nil, fmt.Errorf("dht: %w", err)
	}
	b, err = id.Marshal()
	if err != nil {
		return nil, fmt.Errorf("dht: encoding key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("dht: %w", err)
	}
	if err := atomicfile.Write(path, b); err != nil {
		return nil, fmt.Errorf("dht: writing key: %w", err)
	}
	return id, nil
}

// PeerID returns the node's peer ID.
func (s *Service) PeerID() string { return s.node.PeerID() }

// Addrs returns the node's multiaddrs, with its /p2p/ part.
func (s *Service) Addrs() []string { return s.node.Addrs() }

// Peers returns the peer IDs in the node's routing table.
func (s *Service) Peers() []string { return s.node.Peers() }

// PeerAddrs returns up to limit multiaddrs the node knows for a peer.
func (s *Service) PeerAddrs(id string, limit int) []string { return s.node.PeerAddrs(id, limit) }

// StoredRecords returns the first limit live records the node's DHT store
// holds, by name, and how many it holds: see swarm.Node.StoredRecords.
func (s *Service) StoredRecords(limit int) ([]swarm.Record, int) { return s.node.StoredRecords(limit) }

// URLs returns the base URLs the node puts in its records.
func (s *Service) URLs() []string { return slices.Clone(s.cfg.URLs) }

// Expiry returns how long announced records live: max(2×period, MinExpiry).
func (s *Service) Expiry() time.Duration { return max(2*s.cfg.UpdatePeriod, MinExpiry) }

// Start announces the experts now and then every update period, in the
// background, until StopAnnouncing or Close.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return errors.New("dht: already started")
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel, s.stopped = cancel, make(chan struct{})
	go s.loop(actx, s.stopped)
	return nil
}

// retryAlone is how soon a round that found no peers is retried.
const retryAlone = 2 * time.Second

func (s *Service) loop(ctx context.Context, stopped chan struct{}) {
	defer close(stopped)
	for {
		wait := s.cfg.UpdatePeriod
		if err := s.AnnounceOnce(ctx); errors.Is(err, swarm.ErrNoPeers) {
			wait = min(wait, retryAlone)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// AnnounceOnce announces every hosted expert and its grid prefixes once.
// Failures are logged and counted; it returns swarm.ErrNoPeers if the node
// had nobody to announce to, or the first other error.
func (s *Service) AnnounceOnce(ctx context.Context) error {
	before := s.Names()
	recs := s.records(time.Now())
	// Names announced last round and not now (an undeployed expert, an
	// emptied prefix) are withdrawn rather than left to expire.
	now := s.Names()
	if gone := slices.DeleteFunc(before, func(n string) bool { _, ok := slices.BinarySearch(now, n); return ok }); len(gone) > 0 {
		if err := s.node.Withdraw(ctx, gone); err != nil {
			s.log.Debug("dht withdraw incomplete", "names", len(gone), "err", err)
		}
	}
	begin := time.Now()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, 32)
	)
	for _, r := range recs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			t := time.Now()
			err := s.node.Announce(ctx, r)
			s.metrics.announceSeconds.Observe(time.Since(t).Seconds())
			switch {
			case err == nil:
				s.metrics.announced.WithLabelValues("ok").Inc()
			case errors.Is(err, swarm.ErrNoPeers):
				s.metrics.announced.WithLabelValues("no_peers").Inc()
			default:
				s.metrics.announced.WithLabelValues("error").Inc()
			}
			if err != nil {
				mu.Lock()
				if first == nil || errors.Is(first, swarm.ErrNoPeers) && !errors.Is(err, swarm.ErrNoPeers) {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.metrics.roundSeconds.Observe(time.Since(begin).Seconds())
	if first != nil && ctx.Err() == nil {
		level := slog.LevelWarn
		if errors.Is(first, swarm.ErrNoPeers) {
			level = slog.LevelDebug
		}
		s.log.Log(ctx, level, "dht announce incomplete", "records", len(recs), "err", first)
	}
	return first
}

// records builds this round's records: one per expert, and one per grid
// prefix listing the coordinates hosted right under it.
func (s *Service) records(now time.Time) []swarm.Record {
	expires := now.Add(s.Expiry())
	experts := s.experts.DHTExperts()
	children := map[string]map[int32]bool{}
	recs := make([]swarm.Record, 0, len(experts))
	for _, e := range experts {
		if !swarm.ValidName(e.UID) || swarm.IsPrefix(e.UID) {
			continue
		}
		recs = append(recs, swarm.Record{
			Name: e.UID, URLs: s.cfg.URLs, Digest: e.Digest, Expires: expires,
			StateRoot: e.StateRoot, StateStep: e.StateStep,
			QueueDepth: e.QueueDepth, SamplesPerSecond: e.SamplesPerSecond,
		})
		prefixes, coords := swarm.Prefixes(e.UID)
		for i, p := range prefixes {
			if children[p] == nil {
				children[p] = map[int32]bool{}
			}
			children[p][coords[i]] = true
		}
	}
	for p, set := range children {
		cs := make([]int32, 0, len(set))
		for c := range set {
			cs = append(cs, c)
		}
		slices.Sort(cs)
		if len(cs) > swarm.MaxChildren {
			s.log.Warn("dht: a grid prefix has more children than one record lists; the rest are found by uid only",
				"prefix", p, "children", len(cs), "listed", swarm.MaxChildren)
			cs = cs[:swarm.MaxChildren]
		}
		recs = append(recs, swarm.Record{Name: p, Expires: expires, Children: cs})
	}
	names := make([]string, len(recs))
	for i, r := range recs {
		names[i] = r.Name
	}
	slices.Sort(names)
	s.mu.Lock()
	s.names = names
	s.mu.Unlock()
	return recs
}

// Names returns the names (uids and prefixes) of the last announce round.
func (s *Service) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.names)
}

// StopAnnouncing ends the announce loop and waits for it; the records
// already out expire on their own. Shutdown calls it first.
func (s *Service) StopAnnouncing() {
	s.mu.Lock()
	cancel, stopped := s.cancel, s.stopped
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-stopped
	}
}

// Withdraw stops announcing and replaces every record of the last round
// with a withdrawal (see swarm.Node.Withdraw), so that lookups drop this
// server at once instead of at the records' expiry. A graceful shutdown
// calls it first.
func (s *Service) Withdraw(ctx context.Context) error {
	s.StopAnnouncing()
	names := s.Names()
	err := s.node.Withdraw(ctx, names)
	if err != nil && len(s.node.Peers()) == 0 {
		// A one-node swarm has nobody to tell; that is no error.
		s.log.Debug("dht records not withdrawn: no peers", "records", len(names), "err", err)
		return nil
	}
	s.log.Info("dht records withdrawn", "records", len(names), "err", err)
	return err
}

// Close stops announcing and closes the node.
func (s *Service) Close(ctx context.Context) error {
	s.StopAnnouncing()
	s.metrics.unregister()
	if err := s.node.Close(); err != nil {
		return fmt.Errorf("dht: closing node: %w", err)
	}
	return nil
}

// find is a counted lookup of many names.
func (s *Service) find(ctx context.Context, names []string) (map[string][]swarm.Record, error) {
	t := time.Now()
	out, err := s.node.FindMany(ctx, names)
	s.metrics.lookupSeconds.Observe(time.Since(t).Seconds())
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.metrics.lookups.WithLabelValues(result).Add(float64(len(names)))
	return out, err
}

// metrics are the DHT's collectors in the server's registry.
type metrics struct {
	reg             prometheus.Registerer
	cs              []prometheus.Collector
	announced       *prometheus.CounterVec
	announceSeconds prometheus.Histogram
	roundSeconds    prometheus.Histogram
	lookups         *prometheus.CounterVec
	lookupSeconds   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, peers func() float64, store func() swarm.StoreStats) *metrics {
	m := &metrics{
		reg: reg,
		announced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "records_announced_total",
			Help: "Records (experts and grid prefixes) announced, by result: ok, no_peers, error.",
		}, []string{"result"}),
		announceSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "announce_seconds",
			Help: "Time to announce one record.", Buckets: prometheus.ExponentialBuckets(100e-6, 2, 18),
		}),
		roundSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "announce_round_seconds",
			Help: "Time to announce every record once.", Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16),
		}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "lookups_total",
			Help: "Names looked up for DiscoveryService, by result: ok, error.",
		}, []string{"result"}),
		lookupSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "lookup_seconds",
			Help: "Time of one batch of lookups.", Buckets: prometheus.ExponentialBuckets(100e-6, 2, 18),
		}),
	}
	m.cs = []prometheus.Collector{m.announced, m.announceSeconds, m.roundSeconds, m.lookups, m.lookupSeconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "peers", Help: "Peers in the DHT routing table.",
		}, peers),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "store_bytes",
			Help: "Bytes the DHT store holds (records and provider entries, with per-entry overhead).",
		}, func() float64 { return float64(store().Bytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "store_limit_bytes",
			Help: "The DHT store's bound.",
		}, func() float64 { return float64(store().Limit) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "store_records",
			Help: "Value records in the DHT store.",
		}, func() float64 { return float64(store().Records) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "store_evicted_total",
			Help: "Strangers' entries evicted from the full DHT store.",
		}, func() float64 { return float64(store().Evicted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "moehost", Subsystem: "dht", Name: "store_refused_total",
			Help: "Puts refused by the DHT store (a peer over its share, or a store full of our own records).",
		}, func() float64 { return float64(store().Refused) }),
	}
	if reg != nil {
		for _, c := range m.cs {
			reg.MustRegister(c)
		}
	}
	return m
}

func (m *metrics) unregister() {
	if m.reg != nil {
		for _, c := range m.cs {
			m.reg.Unregister(c)
		}
	}
}
