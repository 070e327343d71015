package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/swarm"
)

// Endpoint is one server hosting one expert, as found in the swarm.
type Endpoint struct {
	// URL is the server's base URL, as New accepts it.
	URL string
	// PeerID is the server's libp2p peer ID, which signed the record.
	PeerID string
	// Digest is the expert's module digest: two servers of one uid with
	// different digests run diverging copies.
	Digest string
	// Expires is when the record stops being valid.
	Expires time.Time
	// QueueDepth and SamplesPerSecond are the expert's announced load.
	QueueDepth       int64
	SamplesPerSecond float64
}

// Choice is an expert chosen by beam search, with its endpoints.
type Choice struct {
	UID       string
	Score     float64
	Endpoints []Endpoint
}

// Directory finds experts: a Swarm (the DHT itself) or a DiscoveryClient
// (a server's DiscoveryService).
type Directory interface {
	// Discover returns the live endpoints of each uid; a prefix ("ffn."
	// or "ffn.3.") stands for every uid under it, up to MaxDiscover uids
	// (then it returns what it found with ErrTruncated). Names with no
	// live endpoint are absent.
	Discover(ctx context.Context, names []string) (map[string][]Endpoint, error)
	// DiscoverPages is Discover one page at a time: yield gets the uids
	// found by each round of lookups (at most PageSize names each) as
	// soon as it ends, until it returns false or nothing remains.
	DiscoverPages(ctx context.Context, names []string, yield func(map[string][]Endpoint) bool) error
	// BeamSearch returns the k existing experts of the grid prefix.i.j…
	// with the highest sum of per-dimension scores, best first. peers, if
	// not empty, limits the search to the records signed by those peer
	// IDs (at most swarm.MaxBeamPeers, each in canonical form): an expert
	// counts only if one of them hosts it, and only their endpoints are
	// returned.
	BeamSearch(ctx context.Context, prefix string, scores [][]float64, k int, peers []string) ([]Choice, error)
}

// SwarmOption configures a Swarm.
type SwarmOption interface{ applySwarm(*swarmOptions) }

type swarmOptions struct {
	cacheTTL, negativeTTL time.Duration
	listen                []string
}

type swarmOptionFunc func(*swarmOptions)

func (f swarmOptionFunc) applySwarm(o *swarmOptions) { f(o) }

// WithCacheTTL sets how long found records are reused (never past their
// expiry). Default 2s; 0 disables the cache.
func WithCacheTTL(d time.Duration) SwarmOption {
	return swarmOptionFunc(func(o *swarmOptions) { o.cacheTTL = d })
}

// WithNegativeTTL sets how long a name found empty (an empty grid prefix,
// a uid nobody hosts) is not looked up again. Default 5s.
func WithNegativeTTL(d time.Duration) SwarmOption {
	return swarmOptionFunc(func(o *swarmOptions) { o.negativeTTL = d })
}

// WithSwarmListen sets the multiaddrs the client's node listens on.
// Default a free TCP port on loopback.
func WithSwarmListen(addrs ...string) SwarmOption {
	return swarmOptionFunc(func(o *swarmOptions) { o.listen = addrs })
}

// Swarm is a client's node in the DHT swarm (a DHT client: it looks up
// and stores nothing for others). It is safe for concurrent use.
type Swarm struct {
	node *swarm.Node
	opts swarmOptions

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	recs  []swarm.Record
	until time.Time
}

// NewSwarm joins the swarm through initial peers (multiaddrs with a
// /p2p/ part, such as the lines of a server's dht-addrs file).
func NewSwarm(ctx context.Context, initialPeers []string, opts ...SwarmOption) (*Swarm, error) {
	o := swarmOptions{cacheTTL: 2 * time.Second, negativeTTL: 5 * time.Second}
	for _, opt := range opts {
		opt.applySwarm(&o)
	}
	if len(initialPeers) == 0 {
		return nil, errors.New("client: no initial peers to join the swarm through")
	}
	n, err := swarm.NewNode(ctx, swarm.Config{Client: true, InitialPeers: initialPeers, Listen: o.listen})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Swarm{node: n, opts: o, cache: map[string]cached{}}, nil
}

// Close leaves the swarm.
func (s *Swarm) Close() error { return s.node.Close() }

// find looks names up through the caches.
func (s *Swarm) find(ctx context.Context, names []string) (map[string][]swarm.Record, error) {
	now := time.Now()
	out := make(map[string][]swarm.Record, len(names))
	var missing []string
	s.mu.Lock()
	for _, n := range names {
		if c, ok := s.cache[n]; ok && now.Before(c.until) {
			out[n] = c.recs
		} else {
			missing = append(missing, n)
		}
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	found, err := s.node.FindMany(ctx, missing)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range missing {
		recs := found[n]
		out[n] = recs
		ttl := s.opts.cacheTTL
		if len(recs) == 0 {
			ttl = s.opts.negativeTTL
		}
		until := now.Add(ttl)
		for _, r := range recs {
			if r.Expires.Before(until) {
				until = r.Expires
			}
		}
		if ttl > 0 {
			s.cache[n] = cached{recs: recs, until: until}
		}
	}
	return out, nil
}

// Discover implements Directory.
func (s *Swarm) Discover(ctx context.Context, names []string) (map[string][]Endpoint, error) {
	return collect(ctx, s, names)
}

// DiscoverPages implements Directory.
func (s *Swarm) DiscoverPages(ctx context.Context, names []string, yield func(map[string][]Endpoint) bool) error {
	return expand(ctx, names, func(ctx context.Context, names []string) (map[string][]Endpoint, map[string][]int32, error) {
		found, err := s.find(ctx, names)
		if err != nil {
			return nil, nil, err
		}
		eps, kids := map[string][]Endpoint{}, map[string][]int32{}
		for n, recs := range found {
			if swarm.IsPrefix(n) {
				lists := make([][]int32, len(recs))
				for i, r := range recs {
					lists[i] = r.Children
				}
				kids[n] = swarm.MergeChildren(lists)
			} else if len(recs) > 0 {
				eps[n] = endpointsOf(recs)
			}
		}
		return eps, kids, nil
	}, yield)
}

// BeamSearch implements Directory.
func (s *Swarm) BeamSearch(ctx context.Context, prefix string, scores [][]float64, k int, peers []string) ([]Choice, error) {
	best, err := swarm.BeamSearch(ctx, s.find, prefix, scores, k, peers)
	if err != nil {
		return nil, err
	}
	out := make([]Choice, len(best))
	for i, b := range best {
		out[i] = Choice{UID: b.UID, Score: b.Score, Endpoints: endpointsOf(b.Records)}
	}
	return out, nil
}

func endpointsOf(recs []swarm.Record) []Endpoint {
	var out []Endpoint
	for _, r := range recs {
		for _, u := range r.URLs {
			out = append(out, Endpoint{URL: u, PeerID: r.PeerID, Digest: r.Digest, Expires: r.Expires, QueueDepth: r.QueueDepth, SamplesPerSecond: r.SamplesPerSecond})
		}
	}
	return out
}

// Bounds of discovery by prefix.
const (
	// PageSize is how many names one round of lookups resolves.
	PageSize = 256
	// MaxDiscover is how many uids Discover returns at most.
	MaxDiscover = 4096
	// maxVisit bounds the names (uids and prefixes) one DiscoverPages
	// looks up, so that records listing children nobody hosts cannot keep
	// it going.
	maxVisit = 1 << 16
)

// ErrTruncated is returned, with what was found, by a Discover that
// stopped at MaxDiscover uids or at its bound on lookups.
var ErrTruncated = errors.New("client: discovery stopped early; more may exist (use DiscoverPages)")

// collect gathers DiscoverPages' pages, up to MaxDiscover uids.
func collect(ctx context.Context, d Directory, names []string) (map[string][]Endpoint, error) {
	out := map[string][]Endpoint{}
	truncated := false
	err := d.DiscoverPages(ctx, names, func(page map[string][]Endpoint) bool {
		for uid, eps := range page {
			if len(out) == MaxDiscover {
				truncated = true
				return false
			}
			out[uid] = eps
		}
		return true
	})
	if err == nil && truncated {
		err = ErrTruncated
	}
	return out, err
}

// expand resolves uids and prefixes a page at a time: a prefix's
// children, in the order the lookup gives them (interleaved across the
// hosts that list them, see swarm.MergeChildren), are tried as uids and
// as deeper prefixes in later pages; each page's uids go to yield.
func expand(ctx context.Context, names []string, lookup func(context.Context, []string) (map[string][]Endpoint, map[string][]int32, error), yield func(map[string][]Endpoint) bool) error {
	seen := map[string]bool{}
	var todo []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			todo = append(todo, n)
		}
	}
	for _, n := range names {
		add(n)
	}
	for len(todo) > 0 {
		batch := todo[:min(PageSize, len(todo))]
		todo = todo[len(batch):]
		eps, kids, err := lookup(ctx, batch)
		if err != nil {
			return err
		}
		// Children in the order of the batch's prefixes, so that pages are
		// deterministic.
		for _, p := range batch {
			for _, c := range kids[p] {
				if len(seen) >= maxVisit {
					break
				}
				child := p + strconv.Itoa(int(c))
				add(child)
				add(child + ".")
			}
		}
		if len(eps) > 0 && !yield(eps) {
			return nil
		}
		if len(seen) >= maxVisit && len(todo) == 0 {
			return fmt.Errorf("%w: looked up %d names", ErrTruncated, len(seen))
		}
	}
	return nil
}

// DiscoveryClient finds experts through one server's DiscoveryService,
// for callers that do not join the swarm.
type DiscoveryClient struct {
	svc moehostv1connect.DiscoveryServiceClient
	own *http.Client
}

// NewDiscoveryClient returns a Directory backed by the DiscoveryService of
// the server at baseURL. It takes the same options as New, WithToken and
// $MOEHOST_TOKEN among them.
func NewDiscoveryClient(baseURL string, opts ...Option) *DiscoveryClient {
	hc, url, copts, own := connectSetup(baseURL, opts)
	return &DiscoveryClient{svc: moehostv1connect.NewDiscoveryServiceClient(hc, url, copts...), own: own}
}

// Close closes the idle connections of the HTTP client it made.
func (d *DiscoveryClient) Close() {
	if d.own != nil {
		d.own.CloseIdleConnections()
	}
}

// Discover implements Directory.
func (d *DiscoveryClient) Discover(ctx context.Context, names []string) (map[string][]Endpoint, error) {
	return collect(ctx, d, names)
}

// DiscoverPages implements Directory.
func (d *DiscoveryClient) DiscoverPages(ctx context.Context, names []string, yield func(map[string][]Endpoint) bool) error {
	return expand(ctx, names, func(ctx context.Context, names []string) (map[string][]Endpoint, map[string][]int32, error) {
		eps, kids := map[string][]Endpoint{}, map[string][]int32{}
		for chunk := range slices.Chunk(names, PageSize) {
			res, err := d.svc.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: chunk}))
			if err != nil {
				return nil, nil, err
			}
			for _, f := range res.Msg.GetFound() {
				if strings.HasSuffix(f.GetName(), ".") {
					kids[f.GetName()] = f.GetChildren()
				} else if len(f.GetEndpoints()) > 0 {
					eps[f.GetName()] = endpointsFromWire(f.GetEndpoints())
				}
			}
		}
		return eps, kids, nil
	}, yield)
}

// BeamSearch implements Directory.
func (d *DiscoveryClient) BeamSearch(ctx context.Context, prefix string, scores [][]float64, k int, peers []string) ([]Choice, error) {
	req := &moehostv1.BeamSearchRequest{Prefix: prefix, K: int32(min(k, swarm.MaxBeamK+1)), Peers: peers}
	for _, s := range scores {
		req.GridScores = append(req.GridScores, &moehostv1.Scores{Values: s})
	}
	res, err := d.svc.BeamSearch(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	// The server is not trusted to have filtered: keep the allowed peers'
	// endpoints, and the experts that have one.
	allowed := swarm.PeerSet(peers)
	var out []Choice
	for _, e := range res.Msg.GetExperts() {
		eps := endpointsFromWire(e.GetEndpoints())
		if allowed != nil {
			eps = slices.DeleteFunc(eps, func(ep Endpoint) bool { return !allowed[ep.PeerID] })
			if len(eps) == 0 {
				continue
			}
		}
		out = append(out, Choice{UID: e.GetUid(), Score: e.GetScore(), Endpoints: eps})
	}
	return out, nil
}

func endpointsFromWire(eps []*moehostv1.Endpoint) []Endpoint {
	out := make([]Endpoint, len(eps))
	for i, e := range eps {
		out[i] = Endpoint{URL: e.GetUrl(), PeerID: e.GetPeerId(), Digest: e.GetDigest(), Expires: time.UnixMilli(e.GetExpiresUnixMs()),
			QueueDepth: e.GetQueueDepth(), SamplesPerSecond: e.GetSamplesPerSecond()}
	}
	return out
}

var (
	_ Directory = (*Swarm)(nil)
	_ Directory = (*DiscoveryClient)(nil)
)
