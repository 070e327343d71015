package swarm_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/moehost/moehost/sdk/swarm"
)

// grid is an in-memory swarm: which uids have live records, and which
// children each prefix's records list (a superset: some are stale).
type grid struct {
	live     map[string]bool
	children map[string][]int32
	lookups  int
}

func (g *grid) find(_ context.Context, names []string) (map[string][]swarm.Record, error) {
	g.lookups += len(names)
	out := map[string][]swarm.Record{}
	for _, n := range names {
		switch {
		case swarm.IsPrefix(n) && len(g.children[n]) > 0:
			out[n] = []swarm.Record{{Name: n, PeerID: "p", Children: g.children[n]}}
		case g.live[n]:
			out[n] = []swarm.Record{{Name: n, PeerID: "p", URLs: []string{"http://" + n}}}
		}
	}
	return out, nil
}

func randomGrid(r *rand.Rand, prefix string, sizes []int) *grid {
	g := &grid{live: map[string]bool{}, children: map[string][]int32{}}
	density := r.Float64()
	var walk func(name string, d int)
	walk = func(name string, d int) {
		for c := 0; c < sizes[d]; c++ {
			child := name + strconv.Itoa(c)
			if d+1 == len(sizes) {
				live := r.Float64() < density
				stale := !live && r.Float64() < 0.2
				if live {
					g.live[child] = true
				}
				if live || stale {
					for i, p := range prefixesOf(child) {
						if !slices.Contains(g.children[p], coordsOf(child)[i]) {
							g.children[p] = append(g.children[p], coordsOf(child)[i])
						}
					}
				}
				continue
			}
			walk(child+".", d+1)
		}
	}
	walk(prefix+".", 0)
	return g
}

func prefixesOf(uid string) []string { p, _ := swarm.Prefixes(uid); return p }
func coordsOf(uid string) []int32    { _, c := swarm.Prefixes(uid); return c }

func bruteForce(g *grid, scores [][]float64, k int) []swarm.Scored {
	var all []swarm.Scored
	for uid := range g.live {
		s := 0.0
		for d, c := range coordsOf(uid) {
			s += scores[d][c]
		}
		all = append(all, swarm.Scored{UID: uid, Score: s})
	}
	slices.SortFunc(all, func(a, b swarm.Scored) int {
		if a.Score != b.Score {
			if a.Score > b.Score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.UID, b.UID)
	})
	return all[:min(k, len(all))]
}

// TestBeamSearchEqualsBruteForce checks, on random grids (with stale
// prefix entries) and random scores, that beam search returns exactly the
// brute-force top k of the existing experts.
func TestBeamSearchEqualsBruteForce(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	totalLookups, trials := 0, 500
	for trial := range trials {
		dims := 1 + r.IntN(3)
		sizes := make([]int, dims)
		scores := make([][]float64, dims)
		for d := range sizes {
			sizes[d] = 1 + r.IntN(8)
			// Scores may cover more coordinates than exist.
			scores[d] = make([]float64, sizes[d]+r.IntN(3))
			for i := range scores[d] {
				scores[d][i] = r.NormFloat64()
			}
		}
		g := randomGrid(r, "ffn", sizes)
		k := 1 + r.IntN(10)
		got, err := swarm.BeamSearch(context.Background(), g.find, "ffn", scores, k, nil)
		if err != nil {
			t.Fatal(err)
		}
		totalLookups += g.lookups
		want := bruteForce(g, scores, k)
		if len(got) != len(want) {
			t.Fatalf("trial %d (sizes %v, k %d): got %d experts, want %d:\n got %v\nwant %v", trial, sizes, k, len(got), len(want), got, want)
		}
		for i := range want {
			if got[i].UID != want[i].UID || got[i].Score != want[i].Score || len(got[i].Records) != 1 {
				t.Fatalf("trial %d (sizes %v, k %d): #%d = %s %g, want %s %g", trial, sizes, k, i, got[i].UID, got[i].Score, want[i].UID, want[i].Score)
			}
		}
	}
	t.Logf("%.1f lookups per search", float64(totalLookups)/float64(trials))
}

func TestBeamSearchRejects(t *testing.T) {
	t.Parallel()
	g := &grid{}
	tests := []struct {
		name   string
		prefix string
		scores [][]float64
		k      int
	}{
		{"k zero", "ffn", [][]float64{{1}}, 0},
		{"k huge", "ffn", [][]float64{{1}}, swarm.MaxBeamK + 1},
		{"no dims", "ffn", nil, 1},
		{"empty dim", "ffn", [][]float64{{1}, {}}, 1},
		{"trailing dot", "ffn.", [][]float64{{1}}, 1},
		{"bad prefix", "f/f", [][]float64{{1}}, 1},
		{"nan", "ffn", [][]float64{{1, nan()}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := swarm.BeamSearch(context.Background(), g.find, tt.prefix, tt.scores, tt.k, nil); err == nil {
				t.Error("no error")
			}
		})
	}
}

func nan() float64 { v, _ := strconv.ParseFloat("NaN", 64); return v }

// peerGrid is an in-memory swarm of several servers: hosts[uid] lists the
// peers with a live record of uid, and each of them lists uid's
// coordinates under its own prefix records, as servers announce.
type peerGrid struct {
	hosts   map[string][]string
	lookups int
}

func (g *peerGrid) find(_ context.Context, names []string) (map[string][]swarm.Record, error) {
	g.lookups += len(names)
	out := map[string][]swarm.Record{}
	for _, n := range names {
		if !swarm.IsPrefix(n) {
			for _, p := range g.hosts[n] {
				out[n] = append(out[n], swarm.Record{Name: n, PeerID: p, URLs: []string{"http://" + p + "/" + n}})
			}
			continue
		}
		kids := map[string][]int32{}
		for uid, peers := range g.hosts {
			for i, pf := range prefixesOf(uid) {
				for _, p := range peers {
					if c := coordsOf(uid)[i]; pf == n && !slices.Contains(kids[p], c) {
						kids[p] = append(kids[p], c)
					}
				}
			}
		}
		for _, p := range slices.Sorted(maps.Keys(kids)) {
			slices.Sort(kids[p])
			out[n] = append(out[n], swarm.Record{Name: n, PeerID: p, Children: kids[p]})
		}
	}
	return out, nil
}

func peerIDs(t *testing.T, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		id, err := swarm.NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = id.PeerID()
	}
	return out
}

// TestBeamSearchOverAllowedPeersEqualsBruteForce checks, on random grids
// hosted by random subsets of three servers, that a beam search allowed a
// subset of them returns the brute-force top k of the experts that an
// allowed server hosts, each with exactly the allowed servers' records.
func TestBeamSearchOverAllowedPeersEqualsBruteForce(t *testing.T) {
	t.Parallel()
	peers := peerIDs(t, 3)
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 300 {
		dims := 1 + r.IntN(3)
		scores := make([][]float64, dims)
		for d := range scores {
			scores[d] = make([]float64, 1+r.IntN(6))
			for i := range scores[d] {
				scores[d][i] = r.NormFloat64()
			}
		}
		g := &peerGrid{hosts: map[string][]string{}}
		var walk func(name string, d int)
		walk = func(name string, d int) {
			for c := range scores[d] {
				child := name + strconv.Itoa(c)
				if d+1 < dims {
					walk(child+".", d+1)
					continue
				}
				for _, p := range peers {
					if r.IntN(3) == 0 {
						g.hosts[child] = append(g.hosts[child], p)
					}
				}
			}
		}
		walk("ffn.", 0)
		var allowed []string
		for _, p := range peers {
			if r.IntN(2) == 0 {
				allowed = append(allowed, p)
			}
		}
		k := 1 + r.IntN(6)
		got, err := swarm.BeamSearch(context.Background(), g.find, "ffn", scores, k, allowed)
		if err != nil {
			t.Fatal(err)
		}
		// The brute force: every uid that an allowed peer (any peer, if
		// none is named) hosts.
		want := &grid{live: map[string]bool{}}
		wantPeers := map[string][]string{}
		for uid, hs := range g.hosts {
			for _, p := range hs {
				if len(allowed) == 0 || slices.Contains(allowed, p) {
					want.live[uid] = true
					wantPeers[uid] = append(wantPeers[uid], p)
				}
			}
		}
		top := bruteForce(want, scores, k)
		if len(got) != len(top) {
			t.Fatalf("trial %d (allowed %d of 3, k %d): got %d experts, want %d:\n got %v\nwant %v", trial, len(allowed), k, len(got), len(top), got, top)
		}
		for i := range top {
			var gotPeers []string
			for _, rec := range got[i].Records {
				gotPeers = append(gotPeers, rec.PeerID)
			}
			if got[i].UID != top[i].UID || got[i].Score != top[i].Score || !slices.Equal(gotPeers, wantPeers[top[i].UID]) {
				t.Fatalf("trial %d (allowed %d of 3, k %d): #%d = %s %g from %v, want %s %g from %v", trial, len(allowed), k, i,
					got[i].UID, got[i].Score, gotPeers, top[i].UID, top[i].Score, wantPeers[top[i].UID])
			}
		}
	}
}

// TestBeamSearchFindsTrustedExpertsBelowACrowd has an untrusted server
// host eight experts that outscore the two of a trusted server (which
// also hosts the best one): a search allowed only the trusted server
// returns its experts, with its records alone, and never looks up the
// crowd's uids.
func TestBeamSearchFindsTrustedExpertsBelowACrowd(t *testing.T) {
	t.Parallel()
	ids := peerIDs(t, 2)
	crowd, trusted := ids[0], ids[1]
	g := &peerGrid{hosts: map[string][]string{"ffn.0": {crowd, trusted}, "ffn.8": {trusted}, "ffn.9": {trusted}}}
	for c := 1; c < 8; c++ {
		g.hosts["ffn."+strconv.Itoa(c)] = []string{crowd}
	}
	scores := [][]float64{{10, 9, 8, 7, 6, 5, 4, 3, 1, 0}}
	got, err := swarm.BeamSearch(context.Background(), g.find, "ffn", scores, 2, []string{trusted})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].UID != "ffn.0" || got[1].UID != "ffn.8" {
		t.Fatalf("got %v, want ffn.0 and ffn.8", got)
	}
	for _, s := range got {
		if len(s.Records) != 1 || s.Records[0].PeerID != trusted {
			t.Errorf("%s: records %v, want the trusted server's alone", s.UID, s.Records)
		}
	}
	if g.lookups != 3 {
		t.Errorf("%d lookups, want 3 (the prefix, then ffn.0 and ffn.8 in one round)", g.lookups)
	}
}

func TestBeamSearchRejectsBadPeers(t *testing.T) {
	t.Parallel()
	ids := peerIDs(t, 1)
	id, err := peer.Decode(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		peers []string
		want  string
	}{
		{"not a peer ID", []string{ids[0], "12D3KooWnobody"}, `"12D3KooWnobody" is not a libp2p peer ID`},
		{"empty", []string{""}, `"" is not a libp2p peer ID`},
		{"CID form", []string{peer.ToCid(id).String()}, "not in canonical form; write it " + ids[0]},
		{"too many", slices.Repeat(ids, swarm.MaxBeamPeers+1), fmt.Sprintf("%d peers, more than %d", swarm.MaxBeamPeers+1, swarm.MaxBeamPeers)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := &grid{}
			_, err := swarm.BeamSearch(context.Background(), g.find, "ffn", [][]float64{{1}}, 1, tt.peers)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one mentioning %s", err, tt.want)
			}
			if g.lookups != 0 {
				t.Errorf("%d lookups before the peers were checked", g.lookups)
			}
		})
	}
	if err := swarm.CheckPeers(slices.Repeat(ids, swarm.MaxBeamPeers)); err != nil {
		t.Errorf("CheckPeers(%d peers) = %v", swarm.MaxBeamPeers, err)
	}
}
