package swarm

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Finder looks names (uids or prefixes) up, returning the live records of
// each. Node.FindMany is one; a client wraps it with caches.
type Finder func(ctx context.Context, names []string) (map[string][]Record, error)

// Scored is an expert chosen by BeamSearch.
type Scored struct {
	// UID names the expert.
	UID string
	// Score is the sum of its coordinates' scores.
	Score float64
	// Records are its live records, one per server.
	Records []Record
}

// MaxBeamK bounds BeamSearch's k.
const MaxBeamK = 1024

// MaxBeamPeers bounds the allow-list of peers of one beam search.
const MaxBeamPeers = 1024

// MaxGridSize bounds the coordinates of one grid dimension that a beam
// search scores.
const MaxGridSize = 1 << 16

// Prefixes returns the grid prefixes under which uid is announced, with
// the coordinate that follows each. A uid is a name of one or more
// non-numeric parts followed by zero or more grid coordinates
// (non-negative int32s written without leading zeros); see CheckUID.
// "ffn.3.14" gives ("ffn.", 3) and ("ffn.3.", 14); the tenant grid uid
// "alice.ffn.2" gives ("alice.ffn.", 2); "expert_a" has none, and so has
// every uid that CheckUID refuses.
func Prefixes(uid string) (prefixes []string, children []int32) {
	parts := strings.Split(uid, ".")
	first, ok := gridStart(parts)
	if !ok {
		return nil, nil
	}
	for i := first; i < len(parts); i++ {
		c, _ := coordinate(parts[i])
		prefixes = append(prefixes, strings.Join(parts[:i], ".")+".")
		children = append(children, c)
	}
	return prefixes, children
}

// CheckUID reports why uid could not be found in the swarm: it is not a
// valid name, or its coordinates are mixed with names ("ffn.0.x": the
// prefix "ffn.0." would list no child "x"), or a coordinate is written
// so that a lookup of the number would miss it ("ffn.01"). Servers refuse
// such uids at deploy.
func CheckUID(uid string) error {
	if !ValidName(uid) || IsPrefix(uid) {
		return fmt.Errorf("uid %.80q is not dot-separated parts of letters, digits, \"_\" and \"-\" (at most %d bytes)", uid, MaxNameLen)
	}
	if _, ok := gridStart(strings.Split(uid, ".")); !ok {
		return fmt.Errorf("uid %q is not discoverable: want name parts that are not numbers (e.g. \"alice.ffn\"), then grid coordinates that are non-negative 32-bit integers without leading zeros (e.g. \"alice.ffn.3.14\")", uid)
	}
	return nil
}

// CheckNamePart reports why part cannot be one dot-separated part of a
// uid: it is empty, or has a character other than letters, digits, "_"
// and "-", named in the error so that no uid carries control or format
// characters (a newline in a log line, an RTL override in a listing).
// A uid whose every part passes, and that is at most MaxNameLen bytes,
// is a ValidName.
func CheckNamePart(part string) error {
	if part == "" {
		return errors.New("a uid has an empty part (a leading, trailing or doubled dot)")
	}
	for _, c := range part {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("uid part %q contains %q; use A-Z, a-z, 0-9, '-' and '_', with '.' between parts", part, c)
		}
	}
	return nil
}

// gridStart returns the index of the first coordinate of a uid split at
// its dots (len(parts) if it has none); ok is false if the parts are not
// names then coordinates.
func gridStart(parts []string) (int, bool) {
	first := len(parts)
	for i, p := range parts {
		if _, isCoord := coordinate(p); isCoord {
			if i == 0 {
				return 0, false // a grid needs a name
			}
			first = i
			break
		}
		if numeric(p) {
			return 0, false // a number that is not a coordinate: "01"
		}
	}
	for _, p := range parts[first:] {
		if _, isCoord := coordinate(p); !isCoord {
			return 0, false
		}
	}
	return first, true
}

// coordinate parses a canonical non-negative int32.
func coordinate(s string) (int32, bool) {
	c, err := strconv.ParseInt(s, 10, 32)
	if err != nil || c < 0 || strconv.FormatInt(c, 10) != s {
		return 0, false
	}
	return int32(c), true
}

// numeric reports whether s is all digits.
func numeric(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// MergeChildren merges the children that several hosts list under one
// prefix: round i takes the i-th child of every host's list (sorted, as
// announcers list them), and the rounds follow each other without
// repeats, so that hosts listing many children nobody hosts cannot push
// the others' back past a page. Each round is sorted, so the result does
// not depend on the order of the lists.
func MergeChildren(lists [][]int32) []int32 {
	seen := map[int32]bool{}
	var out []int32
	for i := 0; ; i++ {
		more := false
		start := len(out)
		for _, l := range lists {
			if i >= len(l) {
				continue
			}
			more = true
			if !seen[l[i]] {
				seen[l[i]] = true
				out = append(out, l[i])
			}
		}
		slices.Sort(out[start:])
		if !more {
			return out
		}
	}
}

// CheckPeers reports why peers cannot be a beam search's allow-list: it
// has more than MaxBeamPeers entries, or an entry is not a libp2p peer ID
// in the canonical text form that records carry (a peer ID written
// otherwise would match no record).
func CheckPeers(peers []string) error {
	if len(peers) > MaxBeamPeers {
		return fmt.Errorf("%d peers, more than %d", len(peers), MaxBeamPeers)
	}
	for _, p := range peers {
		id, err := peer.Decode(p)
		if err != nil {
			return fmt.Errorf("peer %.80q is not a libp2p peer ID", p)
		}
		if id.String() != p {
			return fmt.Errorf("peer %.80q is not in canonical form; write it %s", p, id)
		}
	}
	return nil
}

// PeerSet returns peers as a set for allow-list lookups, or nil, meaning
// every peer, when peers is empty.
func PeerSet(peers []string) map[string]bool {
	if len(peers) == 0 {
		return nil
	}
	set := make(map[string]bool, len(peers))
	for _, p := range peers {
		set[p] = true
	}
	return set
}

// BeamSearch returns the k existing experts of the grid prefix.i.j… with
// the highest sum of scores[d][coordinate d], best first (ties by uid).
// An expert exists if some server has a live record of its uid.
//
// peers, if not empty, is an allow-list (see CheckPeers): the search reads
// only the records of those peers, prefixes and uids alike, so that an
// expert exists only if one of them has a live record of it, its Records
// are theirs alone, and other servers can neither crowd it out of the top
// k nor make the search expand prefixes that no allowed peer lists.
//
// Unlike hivemind's beam search, which keeps the best k prefixes at each
// level and can miss a better expert under a pruned prefix, this is a
// best-first search with an admissible bound (a prefix's score plus the
// best score of each remaining dimension), so its answer equals a brute
// force over every existing expert. It expands up to k prefixes per round
// and looks them up in parallel, so a search takes a few rounds of
// lookups, not one per prefix.
func BeamSearch(ctx context.Context, find Finder, prefix string, scores [][]float64, k int, peers []string) ([]Scored, error) {
	if k < 1 || k > MaxBeamK {
		return nil, fmt.Errorf("k = %d, want 1 to %d", k, MaxBeamK)
	}
	if err := CheckPeers(peers); err != nil {
		return nil, err
	}
	allowed := PeerSet(peers)
	if len(scores) == 0 {
		return nil, errors.New("no grid dimensions")
	}
	if !ValidName(prefix) || IsPrefix(prefix) {
		return nil, fmt.Errorf("grid prefix %q is not a valid name (without the trailing dot)", prefix)
	}
	dims := len(scores)
	// rest[d] is the best score that dimensions d… can still add.
	rest := make([]float64, dims+1)
	for d := dims - 1; d >= 0; d-- {
		if len(scores[d]) == 0 {
			return nil, fmt.Errorf("dimension %d has no scores", d)
		}
		best := math.Inf(-1)
		for _, s := range scores[d] {
			if math.IsNaN(s) || math.IsInf(s, 0) {
				return nil, fmt.Errorf("dimension %d has a score that is not finite", d)
			}
			best = max(best, s)
		}
		rest[d] = rest[d+1] + best
	}
	q := &beamQueue{{name: prefix + ".", bound: rest[0]}}
	var out []Scored
	for len(out) < k && q.Len() > 0 {
		if (*q)[0].checked {
			it := heap.Pop(q).(*beamItem)
			out = append(out, Scored{UID: it.name, Score: it.score, Records: it.records})
			continue
		}
		// Expand the best unchecked items (up to k) in one round.
		var batch []*beamItem
		var deferred []*beamItem
		for q.Len() > 0 && len(batch) < k {
			it := heap.Pop(q).(*beamItem)
			if it.checked {
				deferred = append(deferred, it)
				break
			}
			batch = append(batch, it)
		}
		for _, it := range deferred {
			heap.Push(q, it)
		}
		names := make([]string, len(batch))
		for i, it := range batch {
			names[i] = it.name
		}
		found, err := find(ctx, names)
		if err != nil {
			return nil, fmt.Errorf("beam search: %w", err)
		}
		for _, it := range batch {
			recs := found[it.name]
			if allowed != nil {
				recs = slices.DeleteFunc(slices.Clone(recs), func(r Record) bool { return !allowed[r.PeerID] })
			}
			if it.depth == dims {
				var live []Record
				for _, r := range recs {
					if len(r.URLs) > 0 {
						live = append(live, r)
					}
				}
				if len(live) > 0 {
					heap.Push(q, &beamItem{name: it.name, depth: dims, score: it.score, bound: it.score, checked: true, records: live})
				}
				continue
			}
			seen := map[int32]bool{}
			for _, r := range recs {
				for _, c := range r.Children {
					if seen[c] || int(c) >= len(scores[it.depth]) {
						continue
					}
					seen[c] = true
					child := it.name + strconv.Itoa(int(c))
					s := it.score + scores[it.depth][c]
					if it.depth+1 < dims {
						child += "."
					}
					heap.Push(q, &beamItem{name: child, depth: it.depth + 1, score: s, bound: s + rest[it.depth+1]})
				}
			}
		}
	}
	return out, nil
}

// beamItem is a prefix (or uid) in the search.
type beamItem struct {
	name    string
	depth   int     // coordinates fixed
	score   float64 // their scores' sum
	bound   float64 // score plus the best the rest can add
	checked bool    // a uid whose records were looked up and are live
	records []Record
}

// beamQueue is a max-heap by bound, ties by name.
type beamQueue []*beamItem

func (q beamQueue) Len() int { return len(q) }
func (q beamQueue) Less(i, j int) bool {
	if q[i].bound != q[j].bound {
		return q[i].bound > q[j].bound
	}
	return q[i].name < q[j].name
}
func (q beamQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *beamQueue) Push(x any)   { *q = append(*q, x.(*beamItem)) }
func (q *beamQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}
