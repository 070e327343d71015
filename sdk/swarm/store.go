package swarm

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	ds "github.com/ipfs/go-datastore"
	dsq "github.com/ipfs/go-datastore/query"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-base32"
	"google.golang.org/protobuf/proto"
)

// Default bounds on what a node stores for others (Config.StoreBytes and
// Config.PeerBytes). One record costs at most MaxRecordSize plus its key
// and entryOverhead; a server announcing 1,000 experts needs about 1 MB.
const (
	DefaultStoreBytes = 64 << 20
	DefaultPeerBytes  = 4 << 20
)

// entryOverhead is what one stored entry is charged beyond its key and
// value: the map entry, the eviction list element, the provider index's
// entry and their bookkeeping.
const entryOverhead = 200

// providersPrefix is where the DHT keeps provider records in its datastore.
const providersPrefix = "/providers/"

// Errors of the bounded store, returned to the peer whose PUT_VALUE or
// ADD_PROVIDER did not fit.
var (
	ErrPeerQuota = errors.New("peer's share of the DHT store is full")
	ErrStoreFull = errors.New("DHT store is full of this node's own records")
)

// StoreStats describes a node's DHT store.
type StoreStats struct {
	// Bytes is what the store is charged (keys, values and per-entry
	// overhead); it never passes Limit.
	Bytes, Limit int64
	// Records and Providers count value records and provider entries.
	Records, Providers int
	// Evicted counts strangers' entries dropped to make room, Expired the
	// records dropped at their signed expiry, Refused the puts refused
	// (a peer over its share, or a store full of our own records).
	Evicted, Expired, Refused int64
}

// store is the DHT's datastore (values and providers): in memory, with
// every entry charged to the peer that signed it (a value record) or that
// provides it (a provider entry). A peer's entries may not pass peerLimit;
// the whole store may not pass limit, and when a put would, strangers'
// entries are evicted, oldest first, before our own are touched (never:
// a put of ours that does not fit evicts strangers, and a stranger's put
// that does not fit once only ours remain is refused). A value record is
// dropped at the expiry its signature covers: Get no longer returns it,
// and sweep frees it.
//
// Provider entries are also indexed by their parent key (one content
// ID's provider set), because every GET_PROVIDERS that misses the DHT's
// small cache queries exactly that prefix: answered from the index, the
// query costs the providers of one name instead of a pass over the
// whole store.
type store struct {
	self             string
	limit, peerLimit int64
	now              func() time.Time

	mu      sync.Mutex
	entries map[ds.Key]*entry
	sets    map[string]map[ds.Key]struct{} // provider set's key → its entries' keys
	byPeer  map[string]int64
	order   *list.List // strangers' keys, oldest put first
	stats   StoreStats
}

type entry struct {
	value   []byte
	owner   string
	name    string // a value record's uid or prefix; "" for a provider entry
	cost    int64
	expires time.Time // zero: no signed expiry (provider entries)
	elem    *list.Element
}

func newStore(self string, limit, peerLimit int64) *store {
	return &store{self: self, limit: limit, peerLimit: peerLimit, now: time.Now,
		entries: map[ds.Key]*entry{}, sets: map[string]map[ds.Key]struct{}{},
		byPeer: map[string]int64{}, order: list.New()}
}

// providerSet returns the key of the provider set that key belongs to
// ("/providers/<content ID>", from a key "/providers/<content ID>/..."),
// or "" if key is under no such set.
func providerSet(key string) string {
	rest, ok := strings.CutPrefix(key, providersPrefix)
	if !ok {
		return ""
	}
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return ""
	}
	return key[:len(providersPrefix)+i]
}

// classify returns the owner, name and signed expiry of an entry.
func (s *store) classify(key ds.Key, value []byte) (owner, name string, expires time.Time, err error) {
	k := key.String()
	if strings.HasPrefix(k, providersPrefix) {
		b, err := base32.RawStdEncoding.DecodeString(k[strings.LastIndex(k, "/")+1:])
		if err != nil {
			return "", "", time.Time{}, fmt.Errorf("provider key %.80q: %w", k, err)
		}
		id, err := peer.IDFromBytes(b)
		if err != nil {
			return "", "", time.Time{}, fmt.Errorf("provider key %.80q: %w", k, err)
		}
		return id.String(), "", time.Time{}, nil
	}
	r, err := decodeStored(value, s.now())
	if err != nil {
		return "", "", time.Time{}, err
	}
	return r.PeerID, r.Name, r.Expires, nil
}

func (s *store) Put(_ context.Context, key ds.Key, value []byte) error {
	owner, name, expires, err := s.classify(key, value)
	if err != nil {
		return err
	}
	cost := int64(len(key.String())+len(value)) + entryOverhead
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.entries[key]
	var oldCost int64
	if old != nil && old.owner == owner {
		oldCost = old.cost
	}
	own := owner == s.self
	if !own && s.byPeer[owner]-oldCost+cost > s.peerLimit {
		s.stats.Refused++
		return fmt.Errorf("%w: %s stores %d bytes here, at most %d", ErrPeerQuota, owner, s.byPeer[owner]-oldCost, s.peerLimit)
	}
	if old != nil {
		s.remove(key, old)
	}
	if s.stats.Bytes+cost > s.limit {
		s.sweepLocked()
	}
	for s.stats.Bytes+cost > s.limit && s.order.Len() > 0 {
		k := s.order.Front().Value.(ds.Key)
		s.remove(k, s.entries[k])
		s.stats.Evicted++
	}
	if s.stats.Bytes+cost > s.limit {
		s.stats.Refused++
		return fmt.Errorf("%w: %d of %d bytes", ErrStoreFull, s.stats.Bytes, s.limit)
	}
	e := &entry{value: value, owner: owner, name: name, cost: cost, expires: expires}
	if !own {
		e.elem = s.order.PushBack(key)
	}
	s.entries[key] = e
	s.byPeer[owner] += cost
	s.stats.Bytes += cost
	if set := providerSet(key.String()); set != "" {
		if s.sets[set] == nil {
			s.sets[set] = map[ds.Key]struct{}{}
		}
		s.sets[set][key] = struct{}{}
	}
	if strings.HasPrefix(key.String(), providersPrefix) {
		s.stats.Providers++
	} else {
		s.stats.Records++
	}
	return nil
}

// remove drops an entry; s.mu is held.
func (s *store) remove(key ds.Key, e *entry) {
	delete(s.entries, key)
	if e.elem != nil {
		s.order.Remove(e.elem)
	}
	s.byPeer[e.owner] -= e.cost
	if s.byPeer[e.owner] <= 0 {
		delete(s.byPeer, e.owner)
	}
	s.stats.Bytes -= e.cost
	if set := providerSet(key.String()); set != "" {
		delete(s.sets[set], key)
		if len(s.sets[set]) == 0 {
			delete(s.sets, set)
		}
	}
	if strings.HasPrefix(key.String(), providersPrefix) {
		s.stats.Providers--
	} else {
		s.stats.Records--
	}
}

// live returns key's entry unless it is absent or past its signed expiry,
// which it drops; s.mu is held.
func (s *store) live(key ds.Key) *entry {
	e := s.entries[key]
	if e != nil && !e.expires.IsZero() && !e.expires.After(s.now()) {
		s.remove(key, e)
		s.stats.Expired++
		return nil
	}
	return e
}

// decodeStored decodes a stored value record: a libp2p record wrapping
// our signed one.
func decodeStored(value []byte, now time.Time) (Record, error) {
	var rec recpb.Record
	if err := proto.Unmarshal(value, &rec); err != nil {
		return Record{}, fmt.Errorf("stored record: %w", err)
	}
	return Decode(string(rec.GetKey()), rec.GetValue(), now)
}

// records returns the live value records of the first limit names the
// store holds (by name, then signer), and how many it holds in all.
// Only those limit are decoded, so that a full store costs a scan and a
// sort of its names, not a decode of every record.
func (s *store) records(limit int) ([]Record, int) {
	type named struct {
		name, owner string
		value       []byte // never changed once stored: a put stores a new entry
	}
	s.mu.Lock()
	now := s.now()
	all := make([]named, 0, s.stats.Records)
	for _, e := range s.entries {
		if e.name != "" && (e.expires.IsZero() || e.expires.After(now)) {
			all = append(all, named{e.name, e.owner, e.value})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b named) int {
		return cmp.Or(strings.Compare(a.name, b.name), strings.Compare(a.owner, b.owner))
	})
	out := make([]Record, 0, min(max(limit, 0), len(all)))
	for _, n := range all[:cap(out)] {
		if r, err := decodeStored(n.value, now); err == nil {
			out = append(out, r)
		}
	}
	return out, len(all)
}

// sweepLocked drops every record past its signed expiry; s.mu is held.
func (s *store) sweepLocked() {
	now := s.now()
	for k, e := range s.entries {
		if !e.expires.IsZero() && !e.expires.After(now) {
			s.remove(k, e)
			s.stats.Expired++
		}
	}
}

// sweep drops every record past its signed expiry.
func (s *store) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
}

// Stats returns the store's counters.
func (s *store) Stats() StoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Limit = s.limit
	return st
}

func (s *store) Get(_ context.Context, key ds.Key) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key)
	if e == nil {
		return nil, ds.ErrNotFound
	}
	return e.value, nil
}

func (s *store) Has(_ context.Context, key ds.Key) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live(key) != nil, nil
}

func (s *store) GetSize(_ context.Context, key ds.Key) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key)
	if e == nil {
		return -1, ds.ErrNotFound
	}
	return len(e.value), nil
}

func (s *store) Delete(_ context.Context, key ds.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[key]; e != nil {
		s.remove(key, e)
	}
	return nil
}

// Query answers a query of one provider set from the index, and any
// other by a pass over the store that keeps only the entries under the
// prefix; NaiveQueryApply then applies the rest of q (and the prefix
// again, by the same rule: a prefix of /a finds /a/b, not /ab).
func (s *store) Query(_ context.Context, q dsq.Query) (dsq.Results, error) {
	prefix := ""
	if q.Prefix != "" {
		prefix = path.Clean("/" + strings.TrimPrefix(q.Prefix, "/"))
		if prefix == "/" {
			prefix = ""
		}
	}
	s.mu.Lock()
	now := s.now()
	var es []dsq.Entry
	add := func(k ds.Key, e *entry) {
		if !e.expires.IsZero() && !e.expires.After(now) {
			return
		}
		en := dsq.Entry{Key: k.String(), Size: len(e.value)}
		if !q.KeysOnly {
			en.Value = e.value
		}
		es = append(es, en)
	}
	if prefix != "" && providerSet(prefix+"/") == prefix {
		// Exactly the entries of one provider set, maybe none.
		for k := range s.sets[prefix] {
			add(k, s.entries[k])
		}
	} else {
		for k, e := range s.entries {
			if prefix == "" || strings.HasPrefix(k.String(), prefix+"/") {
				add(k, e)
			}
		}
	}
	s.mu.Unlock()
	return dsq.NaiveQueryApply(q, dsq.ResultsWithEntries(q, es)), nil
}

func (s *store) Sync(context.Context, ds.Key) error { return nil }
func (s *store) Close() error                       { return nil }

func (s *store) Batch(context.Context) (ds.Batch, error) { return ds.NewBasicBatch(s), nil }

var _ ds.Batching = (*store)(nil)
