package hivemind

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	hivemindv1 "github.com/moehost/moehost/gen/hivemind/v1"
)

// hivemind's DHT (DHTProtocol over libp2p): keys are 20-byte DHTIDs,
// SHA1 of the msgpack of the raw key; a value is stored whole ("regular")
// or as a dictionary of subkeys, each with its own expiration; times are
// Unix seconds. A node answers ping, store and find, and keeps a routing
// table of the peers that spoke to it.

// DHT sizes and times, hivemind's defaults where it has one.
const (
	idBytes      = 20
	bucketSize   = 20 // nearest peers returned by find
	numReplicas  = 5  // peers each record is stored on
	waitTimeout  = 3 * time.Second
	minExpiry    = 3 * time.Second // MAX_DHT_TIME_DISCREPANCY_SECONDS
	maxPeers     = 1024            // routing table entries
	maxStoreKeys = 1 << 16         // distinct keys held for others
	// maxStoreBytes bounds what peers may make this node hold.
	maxStoreBytes = 64 << 20
)

// tagRegular marks, in StoreRequest.subkeys, a value without subkey
// (msgpack nil); an empty tag marks a whole dictionary.
var tagRegular = []byte{0xc0}

type dhtID [idBytes]byte

// keyID is hivemind's DHTID of a raw key: SHA1 of its msgpack.
func keyID(packed []byte) dhtID { return sha1.Sum(packed) }

func (a dhtID) xor(b dhtID) (d dhtID) {
	for i := range a {
		d[i] = a[i] ^ b[i]
	}
	return d
}

// dhtNow is hivemind's get_dht_time: Unix seconds.
func dhtNow() float64 { return float64(time.Now().UnixNano()) / 1e9 }

type regular struct {
	value      []byte
	expiration float64
}

// entry is what one key holds: a regular value or a dictionary.
type entry struct {
	reg  *regular
	dict map[string]dictItem // by packed subkey
}

func (e *entry) latest() float64 {
	if e.reg != nil {
		return e.reg.expiration
	}
	l := 0.0
	for _, it := range e.dict {
		l = max(l, it.expiration)
	}
	return l
}

// size is what the entry is charged against maxStoreBytes.
func (e *entry) size() int {
	if e.reg != nil {
		return len(e.reg.value) + 64
	}
	n := 64
	for k, it := range e.dict {
		n += len(k) + len(it.value) + 64
	}
	return n
}

// node is the room's DHT node.
type node struct {
	s    *Server
	id   dhtID
	self peer.ID

	mu    sync.Mutex
	store map[dhtID]*entry
	bytes int
	peers map[peer.ID]dhtID
}

func newNode(s *Server) *node {
	n := &node{s: s, self: s.host.ID(), store: map[dhtID]*entry{}, peers: map[peer.ID]dhtID{}}
	_, _ = rand.Read(n.id[:])
	return n
}

func (n *node) info() *hivemindv1.NodeInfo { return &hivemindv1.NodeInfo{NodeId: n.id[:]} }

// addPeer puts a peer that spoke to us, or answered us, in the table.
func (n *node) addPeer(p peer.ID, id []byte) {
	if len(id) != idBytes || p == n.self {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.peers[p]; !ok && len(n.peers) >= maxPeers {
		return
	}
	n.peers[p] = dhtID(id)
}

func (n *node) dropPeer(p peer.ID) {
	n.mu.Lock()
	delete(n.peers, p)
	n.mu.Unlock()
}

// nearest returns up to k peers of the table nearest to key, except the
// one with node id skip.
func (n *node) nearest(key dhtID, k int, skip []byte) []peerEntry {
	n.mu.Lock()
	out := make([]peerEntry, 0, len(n.peers))
	for p, id := range n.peers {
		if !bytes.Equal(id[:], skip) {
			out = append(out, peerEntry{p, id})
		}
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b peerEntry) int {
		da, db := a.id.xor(key), b.id.xor(key)
		return bytes.Compare(da[:], db[:])
	})
	return out[:min(k, len(out))]
}

type peerEntry struct {
	p  peer.ID
	id dhtID
}

// put stores one record as hivemind's DHTLocalStorage does: a newer
// expiration wins; a subkey turns a regular value into a dictionary.
func (n *node) put(key dhtID, subkey, value []byte, expiration float64) bool {
	if expiration < dhtNow() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.store[key]
	if e == nil && len(n.store) >= maxStoreKeys {
		return false
	}
	before := 0
	if e != nil {
		before = e.size()
	}
	if n.bytes-before+len(subkey)+len(value)+128 > maxStoreBytes {
		return false
	}
	switch {
	case subkey == nil:
		if e != nil && e.latest() >= expiration {
			return false
		}
		e = &entry{reg: &regular{value: value, expiration: expiration}}
	case e == nil || e.reg != nil:
		if e != nil && e.reg.expiration >= expiration {
			return false
		}
		e = &entry{dict: map[string]dictItem{string(subkey): {subkey: subkey, value: value, expiration: expiration}}}
	default:
		if old, ok := e.dict[string(subkey)]; ok && old.expiration >= expiration {
			return false
		}
		e.dict[string(subkey)] = dictItem{subkey: subkey, value: value, expiration: expiration}
	}
	n.store[key] = e
	n.bytes += e.size() - before
	return true
}

// get returns what key holds now, without expired items.
func (n *node) get(key dhtID) *entry {
	now := dhtNow()
	n.mu.Lock()
	defer n.mu.Unlock()
	e := n.store[key]
	if e == nil {
		return nil
	}
	before := e.size()
	if e.reg != nil {
		if e.reg.expiration < now {
			delete(n.store, key)
			n.bytes -= before
			return nil
		}
		return &entry{reg: e.reg}
	}
	for k, it := range e.dict {
		if it.expiration < now {
			delete(e.dict, k)
		}
	}
	n.bytes += e.size() - before
	if len(e.dict) == 0 {
		delete(n.store, key)
		n.bytes -= e.size()
		return nil
	}
	out := &entry{dict: make(map[string]dictItem, len(e.dict))}
	for k, it := range e.dict {
		out.dict[k] = it
	}
	return out
}

// rpcPing answers DHTProtocol.rpc_ping; with validate it pings the
// sender back to say whether it is reachable, as hivemind does.
func (n *node) rpcPing(ctx context.Context, from peer.ID, data []byte) ([]byte, error) {
	var req hivemindv1.PingRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: PingRequest: %w", ErrInvalid, err)
	}
	res := &hivemindv1.PingResponse{Peer: n.info(), DhtTime: dhtNow()}
	if id := req.GetPeer().GetNodeId(); len(id) == idBytes {
		ok := !req.GetValidate()
		if req.GetValidate() {
			got, err := n.callPing(ctx, from)
			ok = err == nil && bytes.Equal(got, id)
			res.Available = ok
		}
		if ok {
			n.addPeer(from, id)
		}
	}
	return proto.Marshal(res)
}

// rpcStore answers DHTProtocol.rpc_store.
func (n *node) rpcStore(_ context.Context, from peer.ID, data []byte) ([]byte, error) {
	var req hivemindv1.StoreRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: StoreRequest: %w", ErrInvalid, err)
	}
	k := len(req.GetKeys())
	if len(req.GetSubkeys()) != k || len(req.GetValues()) != k || len(req.GetExpirationTime()) != k || len(req.GetInCache()) != k {
		return nil, fmt.Errorf("%w: StoreRequest: keys, subkeys, values, expiration_time and in_cache are not aligned", ErrInvalid)
	}
	n.addPeer(from, req.GetPeer().GetNodeId())
	res := &hivemindv1.StoreResponse{Peer: n.info(), StoreOk: make([]bool, k)}
	for i, kb := range req.GetKeys() {
		if len(kb) != idBytes {
			continue
		}
		key, tag, value, exp := dhtID(kb), req.GetSubkeys()[i], req.GetValues()[i], req.GetExpirationTime()[i]
		switch {
		case bytes.Equal(tag, tagRegular):
			res.StoreOk[i] = n.put(key, nil, value, exp)
		case len(tag) == 0:
			items, err := unpackDictionary(value)
			if err != nil {
				continue
			}
			ok := true
			for _, it := range items {
				ok = n.put(key, it.subkey, it.value, it.expiration) && ok
			}
			res.StoreOk[i] = ok
		default:
			res.StoreOk[i] = n.put(key, slices.Clone(tag), value, exp)
		}
	}
	return proto.Marshal(res)
}

// rpcFind answers DHTProtocol.rpc_find: each key's value, if held, and
// the nearest peers of the routing table.
func (n *node) rpcFind(_ context.Context, from peer.ID, data []byte) ([]byte, error) {
	var req hivemindv1.FindRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: FindRequest: %w", ErrInvalid, err)
	}
	if len(req.GetKeys()) > maxStoreKeys {
		return nil, fmt.Errorf("%w: FindRequest: %d keys, at most %d", ErrInvalid, len(req.GetKeys()), maxStoreKeys)
	}
	skip := req.GetPeer().GetNodeId()
	n.addPeer(from, skip)
	res := &hivemindv1.FindResponse{Peer: n.info()}
	for _, kb := range req.GetKeys() {
		r := &hivemindv1.FindResult{}
		res.Results = append(res.Results, r)
		if len(kb) != idBytes {
			continue
		}
		key := dhtID(kb)
		if e := n.get(key); e != nil {
			if e.reg != nil {
				r.Type, r.Value, r.ExpirationTime = hivemindv1.ResultType_RESULT_TYPE_FOUND_REGULAR, e.reg.value, e.reg.expiration
			} else {
				items := make([]dictItem, 0, len(e.dict))
				for _, it := range e.dict {
					items = append(items, it)
				}
				slices.SortFunc(items, func(a, b dictItem) int { return bytes.Compare(a.subkey, b.subkey) })
				r.Type, r.Value, r.ExpirationTime = hivemindv1.ResultType_RESULT_TYPE_FOUND_DICTIONARY, packDictionary(items), e.latest()
			}
		}
		for _, p := range n.nearest(key, bucketSize, skip) {
			r.NearestNodeIds = append(r.NearestNodeIds, p.id[:])
			r.NearestPeerIds = append(r.NearestPeerIds, []byte(p.p))
		}
	}
	return proto.Marshal(res)
}

// callUnary calls a unary protocol on a peer in the p2p daemon's framing.
func (n *node) callUnary(ctx context.Context, p peer.ID, name string, req proto.Message) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	data, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	st, err := n.s.host.NewStream(ctx, p, protocol.ID(name))
	if err != nil {
		return nil, fmt.Errorf("%s to %s: %w", name, p, err)
	}
	defer st.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(d)
	}
	callID := make([]byte, 16)
	_, _ = rand.Read(callID)
	frame, _ := proto.Marshal(&hivemindv1.UnaryFrame{CallId: callID, Message: &hivemindv1.UnaryFrame_CallUnary{
		CallUnary: &hivemindv1.UnaryCall{Peer: []byte(p), Proto: name, Data: data},
	}})
	if err := writeDelimited(st, frame); err != nil {
		return nil, fmt.Errorf("%s to %s: %w", name, p, err)
	}
	b, err := readDelimited(bufio.NewReader(st), MaxUnaryBytes)
	if err != nil {
		return nil, fmt.Errorf("%s to %s: %w", name, p, err)
	}
	var res hivemindv1.UnaryFrame
	if err := proto.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s to %s: %w", name, p, err)
	}
	r := res.GetUnaryResponse()
	if r == nil {
		return nil, fmt.Errorf("%s to %s: no response in the reply", name, p)
	}
	if e := r.GetError(); e != nil {
		return nil, fmt.Errorf("%s to %s: %s", name, p, e)
	}
	return r.GetResponse(), nil
}

// callPing pings p and returns its node id.
func (n *node) callPing(ctx context.Context, p peer.ID) ([]byte, error) {
	b, err := n.callUnary(ctx, p, "DHTProtocol.rpc_ping", &hivemindv1.PingRequest{Peer: n.info()})
	if err != nil {
		return nil, err
	}
	var res hivemindv1.PingResponse
	if err := proto.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	if id := res.GetPeer().GetNodeId(); len(id) == idBytes {
		n.addPeer(p, id)
		return id, nil
	}
	return nil, errors.New("the peer sent no node id (a client-mode node)")
}

// bootstrap connects to the initial peers and pings them into the table.
func (n *node) bootstrap(ctx context.Context, peers []peer.AddrInfo) {
	var wg sync.WaitGroup
	for _, info := range peers {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, waitTimeout)
			defer cancel()
			if err := n.s.host.Connect(cctx, info); err != nil {
				n.s.log.Warn("hivemind: initial peer unreachable", "peer", info.ID.String(), "err", err)
				return
			}
			if _, err := n.callPing(ctx, info.ID); err != nil {
				n.s.log.Warn("hivemind: initial peer did not answer ping", "peer", info.ID.String(), "err", err)
			}
		})
	}
	wg.Wait()
}

// record is one key-value the announcer stores.
type record struct {
	key           dhtID
	subkey, value []byte // subkey nil: a regular value
}

// records are what hivemind's declare_experts stores for uids: uid →
// peer ID, and each grid prefix's coordinate → (uid, peer ID); a
// one-dimensional uid "ffn.5" goes under prefix "ffn.5." with subkey -1.
func records(uids []string, peerID string) []record {
	var out []record
	for _, uid := range uids {
		out = append(out, record{key: keyID(packString(uid)), value: packString(peerID)})
		for _, pc := range prefixes(uid) {
			out = append(out, record{key: keyID(packString(pc.prefix)), subkey: packInt(pc.coord), value: packUIDPeer(uid, peerID)})
		}
	}
	return out
}

// announceLoop announces the experts now and every update period.
func (n *node) announceLoop(ctx context.Context) {
	for {
		n.announce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.s.cfg.UpdatePeriod):
		}
	}
}

// announce stores every record here and on the numReplicas nearest peers
// of the table, with an expiry of max(2×period, 3 s).
func (n *node) announce(ctx context.Context) {
	uids := n.s.experts.HivemindUIDs()
	if len(uids) == 0 {
		return
	}
	exp := dhtNow() + max(2*n.s.cfg.UpdatePeriod, minExpiry).Seconds()
	recs := records(uids, n.s.PeerID())
	byPeer := map[peer.ID]*hivemindv1.StoreRequest{}
	for _, r := range recs {
		n.put(r.key, r.subkey, r.value, exp)
		tag := tagRegular
		if r.subkey != nil {
			tag = r.subkey
		}
		for _, p := range n.nearest(r.key, numReplicas, nil) {
			req := byPeer[p.p]
			if req == nil {
				req = &hivemindv1.StoreRequest{Peer: n.info()}
				byPeer[p.p] = req
			}
			req.Keys = append(req.Keys, r.key[:])
			req.Subkeys = append(req.Subkeys, tag)
			req.Values = append(req.Values, r.value)
			req.ExpirationTime = append(req.ExpirationTime, exp)
			req.InCache = append(req.InCache, false)
		}
	}
	var wg sync.WaitGroup
	for p, req := range byPeer {
		wg.Go(func() {
			if _, err := n.callUnary(ctx, p, "DHTProtocol.rpc_store", req); err != nil {
				n.s.log.Debug("hivemind: store failed; dropping the peer", "peer", p.String(), "err", err)
				n.dropPeer(p)
			}
		})
	}
	wg.Wait()
	n.s.log.Debug("hivemind: announced", "uids", len(uids), "records", len(recs), "peers", len(byPeer))
}
