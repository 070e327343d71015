package swarm_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

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
		got, err := swarm.BeamSearch(context.Background(), g.find, "ffn", scores, k)
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
			if _, err := swarm.BeamSearch(context.Background(), g.find, tt.prefix, tt.scores, tt.k); err == nil {
				t.Error("no error")
			}
		})
	}
}

func nan() float64 { v, _ := strconv.ParseFloat("NaN", 64); return v }

var _ = fmt.Sprint
