package rpc

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/swarm"
)

// Discovery is the server's DHT node as DiscoveryService sees it; package
// host hands it the dht room's. The handler checks and converts the
// requests, so the names, prefixes and bounds it passes on are valid. Its
// errors wrap the room's own sentinels, which the Codes table maps.
type Discovery interface {
	// Find returns the live records of each of names: uids, and grid
	// prefixes ("ffn.3.").
	Find(ctx context.Context, names []string) (map[string][]swarm.Record, error)
	// Beam returns the k existing experts of the grid prefix with the
	// highest sums of scores, best first, as swarm.BeamSearch does;
	// peers, if not empty, are the only peers whose records count.
	Beam(ctx context.Context, prefix string, scores [][]float64, k int, peers []string) ([]swarm.Scored, error)
}

// Limits of DiscoveryService's requests.
const (
	// MaxFindNames bounds the names of one FindExperts request.
	MaxFindNames = 1024
	// maxGridDims bounds the grid dimensions of one BeamSearch request.
	maxGridDims = 16
)

// discoveryHandler returns DiscoveryService's path and handler over d:
// its requests are small ones, its errors are coded by codes, and m
// counts its calls. It asks
// for no token: anyone may look experts up.
func discoveryHandler(d Discovery, codes Codes, m *Metrics) (string, http.Handler) {
	return moehostv1connect.NewDiscoveryServiceHandler(discoveryService{d},
		m.interceptors(codes.Interceptor()),
		readLimit(smallMessageBytes),
	)
}

// discoveryService implements moehost.v1.DiscoveryService.
type discoveryService struct{ d Discovery }

// badQuery is this service's refusal of a request, an InvalidArgument
// *connect.Error that says it is a bad discovery query.
func badQuery(format string, args ...any) error {
	return errorf(connect.CodeInvalidArgument, "bad discovery query: "+format, args...)
}

func (s discoveryService) FindExperts(ctx context.Context, req *connect.Request[moehostv1.FindExpertsRequest]) (*connect.Response[moehostv1.FindExpertsResponse], error) {
	names := req.Msg.GetNames()
	if len(names) == 0 {
		return nil, badQuery("no names to find")
	}
	if len(names) > MaxFindNames {
		return nil, badQuery("%d names, more than %d", len(names), MaxFindNames)
	}
	for _, n := range names {
		if !swarm.ValidName(n) {
			return nil, badQuery("%.80q is not a uid or a prefix", n)
		}
	}
	found, err := s.d.Find(ctx, names)
	if err != nil {
		return nil, err // the room's, which says the lookup failed
	}
	res := &moehostv1.FindExpertsResponse{}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] || len(found[n]) == 0 {
			continue
		}
		seen[n] = true
		f := &moehostv1.Found{Name: n, Endpoints: endpoints(found[n])}
		if swarm.IsPrefix(n) {
			f.Children = children(found[n])
		}
		res.Found = append(res.Found, f)
	}
	return connect.NewResponse(res), nil
}

func (s discoveryService) BeamSearch(ctx context.Context, req *connect.Request[moehostv1.BeamSearchRequest]) (*connect.Response[moehostv1.BeamSearchResponse], error) {
	k := int(req.Msg.GetK())
	if k < 1 || k > swarm.MaxBeamK {
		return nil, badQuery("k = %d, want 1 to %d", k, swarm.MaxBeamK)
	}
	if n := len(req.Msg.GetGridScores()); n == 0 || n > maxGridDims {
		return nil, badQuery("%d grid dimensions, want 1 to %d", n, maxGridDims)
	}
	scores := make([][]float64, len(req.Msg.GetGridScores()))
	for i, sc := range req.Msg.GetGridScores() {
		if len(sc.GetValues()) > swarm.MaxGridSize {
			return nil, badQuery("dimension %d has %d scores, more than %d", i, len(sc.GetValues()), swarm.MaxGridSize)
		}
		scores[i] = sc.GetValues()
	}
	prefix := req.Msg.GetPrefix()
	if !swarm.ValidName(prefix) || swarm.IsPrefix(prefix) {
		return nil, badQuery("prefix %.80q is not a grid name (without the trailing dot)", prefix)
	}
	best, err := s.d.Beam(ctx, prefix, scores, k, req.Msg.GetPeers())
	if err != nil {
		return nil, err // the room's, which says what the search refused
	}
	res := &moehostv1.BeamSearchResponse{}
	for _, b := range best {
		res.Experts = append(res.Experts, &moehostv1.ScoredExpert{Uid: b.UID, Score: b.Score, Endpoints: endpoints(b.Records)})
	}
	return connect.NewResponse(res), nil
}

// endpoints turns a uid's records into wire endpoints, one per URL.
func endpoints(recs []swarm.Record) []*moehostv1.Endpoint {
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

var _ moehostv1connect.DiscoveryServiceHandler = discoveryService{}
