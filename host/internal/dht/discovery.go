package dht

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/swarm"
)

// MaxFindNames bounds the names of one FindExperts request.
const MaxFindNames = 1024

// Handler returns the path and handler of moehost.v1.DiscoveryService,
// answered from the service's DHT node.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return moehostv1connect.NewDiscoveryServiceHandler(discovery{s}, opts...)
}

// discovery implements moehost.v1.DiscoveryService.
type discovery struct{ s *Service }

func (d discovery) FindExperts(ctx context.Context, req *connect.Request[moehostv1.FindExpertsRequest]) (*connect.Response[moehostv1.FindExpertsResponse], error) {
	names := req.Msg.GetNames()
	if len(names) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("no names to find"))
	}
	if len(names) > MaxFindNames {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%d names, more than %d", len(names), MaxFindNames))
	}
	for _, n := range names {
		if !swarm.ValidName(n) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%.80q is not a uid or a prefix", n))
		}
	}
	found, err := d.s.find(ctx, names)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
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
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("k = %d, want 1 to %d", k, swarm.MaxBeamK))
	}
	if n := len(req.Msg.GetGridScores()); n == 0 || n > 16 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%d grid dimensions, want 1 to 16", n))
	}
	scores := make([][]float64, len(req.Msg.GetGridScores()))
	for i, sc := range req.Msg.GetGridScores() {
		if len(sc.GetValues()) > swarm.MaxChildren {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("dimension %d has %d scores, more than %d", i, len(sc.GetValues()), swarm.MaxChildren))
		}
		scores[i] = sc.GetValues()
	}
	if !swarm.ValidName(req.Msg.GetPrefix()) || swarm.IsPrefix(req.Msg.GetPrefix()) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("prefix %.80q is not a grid name (without the trailing dot)", req.Msg.GetPrefix()))
	}
	best, err := swarm.BeamSearch(ctx, d.s.find, req.Msg.GetPrefix(), scores, k)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
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

func children(recs []swarm.Record) []int32 {
	var out []int32
	for _, r := range recs {
		out = append(out, r.Children...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

var _ moehostv1connect.DiscoveryServiceHandler = discovery{}
