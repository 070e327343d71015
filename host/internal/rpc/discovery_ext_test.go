package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/sdk/swarm"
)

// errNoPeers stands in for the dht room's lookup sentinel.
var errNoPeers = errors.New("no peers")

// fakeDiscovery answers from fixed records and remembers what it was
// asked.
type fakeDiscovery struct {
	found map[string][]swarm.Record
	best  []swarm.Scored
	err   error

	mu    sync.Mutex
	names [][]string
	beams []beamCall
}

type beamCall struct {
	prefix string
	scores [][]float64
	k      int
	peers  []string
}

func (f *fakeDiscovery) Find(_ context.Context, names []string) (map[string][]swarm.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names = append(f.names, names)
	return f.found, f.err
}

func (f *fakeDiscovery) Beam(_ context.Context, prefix string, scores [][]float64, k int, peers []string) ([]swarm.Scored, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.beams = append(f.beams, beamCall{prefix, scores, k, peers})
	return f.best, f.err
}

func (f *fakeDiscovery) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.names) + len(f.beams)
}

func discoveryClient(t *testing.T, d rpc.Discovery) moehostv1connect.DiscoveryServiceClient {
	t.Helper()
	opts := rpc.Options{Codes: rpc.Codes{{Err: errNoPeers, Code: connect.CodeUnavailable}}, Discovery: d}
	return moehostv1connect.NewDiscoveryServiceClient(h2c(), server(t, noExperts{}, opts))
}

// TestDiscoveryConverts checks that FindExperts and BeamSearch hand the
// request on as it came and answer with every field of the records: one
// endpoint per URL, a prefix's children merged, each name found once.
func TestDiscoveryConverts(t *testing.T) {
	t.Parallel()
	expires := time.UnixMilli(1_700_000_000_123)
	rec := func(peer string, children []int32, urls ...string) swarm.Record {
		return swarm.Record{URLs: urls, PeerID: peer, Digest: "sha256:" + peer, Expires: expires, QueueDepth: 3, SamplesPerSecond: 1.5, Children: children}
	}
	ep := func(url, peer string) *moehostv1.Endpoint {
		return &moehostv1.Endpoint{Url: url, PeerId: peer, Digest: "sha256:" + peer, ExpiresUnixMs: expires.UnixMilli(), QueueDepth: 3, SamplesPerSecond: 1.5}
	}
	d := &fakeDiscovery{
		found: map[string][]swarm.Record{
			"ffn.0": {rec("p1", nil, "http://a", "https://a"), rec("p2", nil, "http://b")},
			"ffn.":  {rec("p1", []int32{0, 2}), rec("p2", []int32{1, 2})},
		},
		best: []swarm.Scored{{UID: "ffn.2", Score: 3.5, Records: []swarm.Record{rec("p2", nil, "http://b")}}},
	}
	c := discoveryClient(t, d)
	ctx := context.Background()

	names := []string{"ffn.0", "ffn.", "ffn.0", "ffn.9"}
	res, err := c.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: names}))
	if err != nil {
		t.Fatal(err)
	}
	want := &moehostv1.FindExpertsResponse{Found: []*moehostv1.Found{
		{Name: "ffn.0", Endpoints: []*moehostv1.Endpoint{ep("http://a", "p1"), ep("https://a", "p1"), ep("http://b", "p2")}},
		{Name: "ffn.", Children: swarm.MergeChildren([][]int32{{0, 2}, {1, 2}})},
	}}
	if !proto.Equal(res.Msg, want) {
		t.Errorf("FindExperts = %v, want %v", res.Msg, want)
	}
	if len(d.names) != 1 || !slices.Equal(d.names[0], names) {
		t.Errorf("Find got %v, want %v", d.names, names)
	}
	if got := want.GetFound()[1].GetChildren(); !slices.Equal(got, []int32{0, 1, 2}) {
		t.Errorf("children merged to %v, want [0 1 2]", got)
	}

	bres, err := c.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "ffn", K: 2, Peers: []string{"p2"},
		GridScores: []*moehostv1.Scores{{Values: []float64{1, 0, 3}}, {Values: []float64{0.5}}}}))
	if err != nil {
		t.Fatal(err)
	}
	bwant := &moehostv1.BeamSearchResponse{Experts: []*moehostv1.ScoredExpert{{Uid: "ffn.2", Score: 3.5, Endpoints: []*moehostv1.Endpoint{ep("http://b", "p2")}}}}
	if !proto.Equal(bres.Msg, bwant) {
		t.Errorf("BeamSearch = %v, want %v", bres.Msg, bwant)
	}
	if len(d.beams) != 1 {
		t.Fatalf("Beam called %d times", len(d.beams))
	}
	if b := d.beams[0]; b.prefix != "ffn" || b.k != 2 || !slices.Equal(b.peers, []string{"p2"}) ||
		len(b.scores) != 2 || !slices.Equal(b.scores[0], []float64{1, 0, 3}) || !slices.Equal(b.scores[1], []float64{0.5}) {
		t.Errorf("Beam got %+v", b)
	}
}

// TestDiscoveryRefuses checks each request check: InvalidArgument, a
// message that says what is wrong (once, without the code's name), and
// no lookup.
func TestDiscoveryRefuses(t *testing.T) {
	t.Parallel()
	d := &fakeDiscovery{}
	c := discoveryClient(t, d)
	ctx := context.Background()
	one := []*moehostv1.Scores{{Values: []float64{1}}}
	find := func(names ...string) func() error {
		return func() error {
			_, err := c.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: names}))
			return err
		}
	}
	beam := func(prefix string, k int32, scores []*moehostv1.Scores) func() error {
		return func() error {
			_, err := c.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: prefix, K: k, GridScores: scores}))
			return err
		}
	}
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"no names", find(), "bad discovery query: no names to find"},
		{"too many names", find(slices.Repeat([]string{"x.0"}, rpc.MaxFindNames+1)...), fmt.Sprintf("%d names, more than %d", rpc.MaxFindNames+1, rpc.MaxFindNames)},
		{"bad name", find("x.0", "a/b"), `"a/b" is not a uid or a prefix`},
		{"k zero", beam("x", 0, one), fmt.Sprintf("k = 0, want 1 to %d", swarm.MaxBeamK)},
		{"k too big", beam("x", swarm.MaxBeamK+1, one), fmt.Sprintf("k = %d", swarm.MaxBeamK+1)},
		{"no dims", beam("x", 1, nil), "0 grid dimensions, want 1 to 16"},
		{"too many dims", beam("x", 1, slices.Repeat(one, 17)), "17 grid dimensions, want 1 to 16"},
		{"grid too big", beam("x", 1, []*moehostv1.Scores{{Values: make([]float64, swarm.MaxGridSize+1)}}), fmt.Sprintf("dimension 0 has %d scores, more than %d", swarm.MaxGridSize+1, swarm.MaxGridSize)},
		{"prefix with dot", beam("x.", 1, one), `prefix "x." is not a grid name`},
		{"empty prefix", beam("", 1, one), `prefix "" is not a grid name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want InvalidArgument mentioning %q", err, tt.want)
			}
			if err != nil && strings.Count(err.Error(), "invalid_argument") > 1 {
				t.Errorf("code repeated in %q", err)
			}
		})
	}
	if n := d.calls(); n != 0 {
		t.Errorf("refused requests reached the node %d times", n)
	}
}

// TestDiscoveryCodesRoomErrors checks that the node's errors reach the
// caller coded by the Codes table, with their own message, and that no
// DiscoveryService is served without Discovery.
func TestDiscoveryCodesRoomErrors(t *testing.T) {
	t.Parallel()
	d := &fakeDiscovery{err: fmt.Errorf("DHT lookup failed: %w", errNoPeers)}
	c := discoveryClient(t, d)
	ctx := context.Background()
	_, err := c.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: []string{"x.0"}}))
	if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable || ce.Message() != "DHT lookup failed: no peers" {
		t.Errorf("FindExperts: %v, want Unavailable with the room's message", err)
	}
	_, err = c.BeamSearch(ctx, connect.NewRequest(&moehostv1.BeamSearchRequest{Prefix: "x", K: 1, GridScores: []*moehostv1.Scores{{Values: []float64{1}}}}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("BeamSearch: %v, want Unavailable", err)
	}

	_, err = discoveryClient(t, nil).FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: []string{"x.0"}}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("DiscoveryService without Discovery: %v, want Unimplemented", err)
	}
}
