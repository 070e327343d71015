package dht

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/swarm"
)

// Errors of DiscoveryService, which the server's Codes table maps to
// Connect codes.
var (
	// ErrBadQuery: a FindExperts or BeamSearch request that asks for
	// nothing, too much, or names no uid or grid.
	ErrBadQuery = errors.New("bad discovery query")
	// ErrLookup: the DHT could not answer (no peers, the network).
	ErrLookup = errors.New("DHT lookup failed")
)

// MaxFindNames bounds the names of one FindExperts request.
const MaxFindNames = 1024

// Handler returns the path and handler of moehost.v1.DiscoveryService,
// answered from the service's DHT node. Its errors wrap ErrBadQuery or
// ErrLookup; the caller codes them, with an interceptor in opts.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return moehostv1connect.NewDiscoveryServiceHandler(discovery{s}, opts...)
}

// discovery implements moehost.v1.DiscoveryService.
type discovery struct{ s *Service }

func (d discovery) FindExperts(ctx context.Context, req *connect.Request[moehostv1.FindExpertsRequest]) (*connect.Response[moehostv1.FindExpertsResponse], error) {
	names := req.Msg.GetNames()
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no names to find", ErrBadQuery)
	}
	if len(names) > MaxFindNames {
		return nil, fmt.Errorf("%w: %d names, more than %d", ErrBadQuery, len(names), MaxFindNames)
	}
	for _, n := range names {
		if !swarm.ValidName(n) {
			return nil, fmt.Errorf("%w: %.80q is not a uid or a prefix", ErrBadQuery, n)
		}
	}
	found, err := d.s.find(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLookup, err)
	}
	res := &moehostv1.FindExpertsResponse{}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] || len(found[n]) == 0 {
			continue
		}
		seen[n] = true
		f := &moehostv1.Found{Name: n, Endpoints: Endpoints(found[n])}
		if swarm.IsPrefix(n) {
			f.Children = children(found[n])
		}
		res.Found = append(res.Found, f)
	}
	return connect.NewResponse(res), nil
}

func (d discovery) BeamSearch(ctx context.Context, req *connect.Request[moehostv1.BeamSearchRequest]) (*connect.Response[moehostv1.BeamSearchResponse], error) {
	k := int(req.Msg.GetK())
	if k < 1 || k > swarm.MaxBeamK {
		return nil, fmt.Errorf("%w: k = %d, want 1 to %d", ErrBadQuery, k, swarm.MaxBeamK)
	}
	if n := len(req.Msg.GetGridScores()); n == 0 || n > 16 {
		return nil, fmt.Errorf("%w: %d grid dimensions, want 1 to 16", ErrBadQuery, n)
	}
	scores := make([][]float64, len(req.Msg.GetGridScores()))
	for i, sc := range req.Msg.GetGridScores() {
		if len(sc.GetValues()) > swarm.MaxGridSize {
			return nil, fmt.Errorf("%w: dimension %d has %d scores, more than %d", ErrBadQuery, i, len(sc.GetValues()), swarm.MaxGridSize)
		}
		scores[i] = sc.GetValues()
	}
	if !swarm.ValidName(req.Msg.GetPrefix()) || swarm.IsPrefix(req.Msg.GetPrefix()) {
		return nil, fmt.Errorf("%w: prefix %.80q is not a grid name (without the trailing dot)", ErrBadQuery, req.Msg.GetPrefix())
	}
	best, err := swarm.BeamSearch(ctx, d.s.find, req.Msg.GetPrefix(), scores, k, req.Msg.GetPeers())
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrBadQuery, err)
	}
	res := &moehostv1.BeamSearchResponse{}
	for _, b := range best {
		res.Experts = append(res.Experts, &moehostv1.ScoredExpert{Uid: b.UID, Score: b.Score, Endpoints: Endpoints(b.Records)})
	}
	return connect.NewResponse(res), nil
}

// Endpoints turns a uid's records into wire endpoints, one per URL.
func Endpoints(recs []swarm.Record) []*moehostv1.Endpoint {
	var out []*moehostv1.Endpoint
	for _, r := range recs {
		for _, u := range r.URLs {
			out = append(out, &moehostv1.Endpoint{
				Url: u, PeerId: r.PeerID, Digest: r.Digest, ExpiresUnixMs: r.Expires.UnixMilli(),
				QueueDepth: r.QueueDepth, SamplesPerSecond: r.SamplesPerSecond,
			})
		}
	}
	return out
}

// children merges the children that the prefix's records list, one host
// at a time (swarm.MergeChildren), so that a client expanding them a page
// at a time reaches every honest host's children early.
func children(recs []swarm.Record) []int32 {
	lists := make([][]int32, len(recs))
	for i, r := range recs {
		lists[i] = r.Children
	}
	return swarm.MergeChildren(lists)
}

var _ moehostv1connect.DiscoveryServiceHandler = discovery{}
