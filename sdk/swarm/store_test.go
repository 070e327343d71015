package swarm_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	ds "github.com/ipfs/go-datastore"
	dsq "github.com/ipfs/go-datastore/query"
	recpb "github.com/libp2p/go-libp2p-record/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-base32"
	"google.golang.org/protobuf/proto"

	"github.com/moehost/moehost/sdk/swarm"
)

// storedRecord is a DHT datastore entry of a signed record, as the DHT's
// value store writes it.
func storedRecord(t testing.TB, id *swarm.Identity, name string, expires time.Time) (ds.Key, []byte) {
	t.Helper()
	v, err := id.Sign(swarm.Record{Name: name, URLs: []string{"http://127.0.0.1:1"}, Digest: "sha256:00", Expires: expires})
	if err != nil {
		t.Fatal(err)
	}
	key := swarm.Key(id.PeerID(), name)
	b, err := proto.Marshal(&recpb.Record{Key: []byte(key), Value: v})
	if err != nil {
		t.Fatal(err)
	}
	return ds.NewKey("/moehost/" + base32.RawStdEncoding.EncodeToString([]byte(key))), b
}

// TestStoreBoundedUnderFlood floods a store bounded to 64 KiB with valid
// records of 200 strangers: it never passes the bound, evicts the oldest
// strangers first, keeps every record of its own, refuses a stranger past
// its share, and drops records at their signed expiry.
func TestStoreBoundedUnderFlood(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	self, _ := swarm.NewIdentity()
	const limit, peerLimit = 64 << 10, 4 << 10
	st := swarm.NewStore(self.PeerID(), limit, peerLimit)
	now := time.Now()
	swarm.SetStoreClock(st, func() time.Time { return now })
	var own []ds.Key
	for i := range 20 {
		k, v := storedRecord(t, self, fmt.Sprintf("ffn.%d", i), now.Add(time.Hour))
		if err := st.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		own = append(own, k)
	}
	var first ds.Key
	for p := range 200 {
		id, _ := swarm.NewIdentity()
		for i := 0; ; i++ {
			k, v := storedRecord(t, id, fmt.Sprintf("ffn.%d", i), now.Add(time.Hour))
			if p == 0 && i == 0 {
				first = k
			}
			err := st.Put(ctx, k, v)
			if errors.Is(err, swarm.ErrPeerQuota) {
				if i == 0 {
					t.Fatal("a stranger's first record refused")
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := swarm.StatsOf(st); s.Bytes > limit {
				t.Fatalf("store holds %d bytes, bound %d", s.Bytes, limit)
			}
		}
	}
	s := swarm.StatsOf(st)
	t.Logf("after the flood: %+v", s)
	if s.Evicted == 0 || s.Refused < 200 {
		t.Errorf("stats %+v: want evictions and one refusal per stranger", s)
	}
	for _, k := range own {
		if ok, _ := st.Has(ctx, k); !ok {
			t.Fatalf("own record %s evicted by strangers", k)
		}
	}
	if ok, _ := st.Has(ctx, first); ok {
		t.Error("the oldest stranger's record survived the flood")
	}
	now = now.Add(2 * time.Hour)
	if _, err := st.Get(ctx, own[0]); !errors.Is(err, ds.ErrNotFound) {
		t.Errorf("Get of a record past its signed expiry = %v, want ErrNotFound", err)
	}
}

// TestStoredRecords: the store lists its live value records by name, then
// signer, the first limit of them decoded, with the count of all; expired
// records and provider entries are not listed.
func TestStoredRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	self, _ := swarm.NewIdentity()
	other, _ := swarm.NewIdentity()
	st := swarm.NewStore(self.PeerID(), 1<<20, 1<<20)
	now := time.Now()
	swarm.SetStoreClock(st, func() time.Time { return now })
	for _, r := range []struct {
		id      *swarm.Identity
		name    string
		expires time.Time
	}{
		{self, "ffn.1", now.Add(time.Hour)},
		{other, "ffn.0", now.Add(time.Hour)},
		{self, "ffn.0", now.Add(time.Hour)},
		{other, "ffn.2", now.Add(time.Second)}, // expires below
		{other, "attn.0", now.Add(time.Hour)},
	} {
		k, v := storedRecord(t, r.id, r.name, r.expires)
		if err := st.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Put(ctx, ds.NewKey("/providers/x/"+base32.RawStdEncoding.EncodeToString([]byte(other.PeerID()))), []byte("p")); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second)
	first, second := self.PeerID(), other.PeerID()
	if first > second {
		first, second = second, first
	}
	recs, total := swarm.RecordsOf(st, 3)
	var got []string
	for _, r := range recs {
		got = append(got, r.Name+"@"+r.PeerID)
	}
	want := []string{"attn.0@" + other.PeerID(), "ffn.0@" + first, "ffn.0@" + second}
	if total != 4 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records = %v of %d, want %v of 4", got, total, want)
	}
	if recs[0].URLs[0] != "http://127.0.0.1:1" || !recs[0].Expires.After(now) {
		t.Errorf("record %+v not decoded", recs[0])
	}
	if recs, total := swarm.RecordsOf(st, 0); len(recs) != 0 || total != 4 {
		t.Errorf("limit 0: %d records of %d", len(recs), total)
	}
}

// TestStoreQuery checks that the store answers each query, a provider
// set's from its index and the others by a pass, exactly as a plain map
// datastore holding the same entries does.
func TestStoreQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	self, _ := swarm.NewIdentity()
	st := swarm.NewStore(self.PeerID(), 1<<20, 1<<20)
	ref := ds.NewMapDatastore()
	put := func(k ds.Key, v []byte) {
		t.Helper()
		if err := st.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		if err := ref.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	var ids []*swarm.Identity
	for range 3 {
		id, _ := swarm.NewIdentity()
		ids = append(ids, id)
	}
	// Two content IDs whose encodings share a leading part, so that one
	// is a string prefix (but no path prefix) of the other.
	sets := []string{"/providers/CIQABC", "/providers/CIQABCD", "/providers/CIQXYZ"}
	for i, set := range sets {
		for _, id := range ids[:i+1] {
			pid, _ := peer.Decode(id.PeerID())
			put(ds.NewKey(set+"/"+base32.RawStdEncoding.EncodeToString([]byte(pid))), []byte{byte(i)})
		}
	}
	pid, _ := peer.Decode(ids[0].PeerID())
	put(ds.NewKey("/providers/"+base32.RawStdEncoding.EncodeToString([]byte(pid))), []byte{9})       // no content ID
	put(ds.NewKey(sets[0]+"/deeper/"+base32.RawStdEncoding.EncodeToString([]byte(pid))), []byte{10}) // one level more
	for i, id := range ids {
		put(storedRecord(t, id, fmt.Sprintf("ffn.%d", i), time.Now().Add(time.Hour)))
	}
	// A provider entry dropped again leaves its set.
	gone := ds.NewKey(sets[2] + "/" + base32.RawStdEncoding.EncodeToString([]byte(pid)))
	for _, d := range []ds.Datastore{st, ref} {
		if err := d.Delete(ctx, gone); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(d ds.Datastore, q dsq.Query) []string {
		t.Helper()
		res, err := d.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		es, err := res.Rest()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es {
			out = append(out, fmt.Sprintf("%s=%x", e.Key, e.Value))
		}
		slices.Sort(out)
		return out
	}
	for _, prefix := range []string{"", "/", sets[0], sets[0] + "/", sets[1], sets[2], "/providers/CIQAB", "/providers/NONE", sets[0] + "/deeper", "/providers", "/providers/", "providers", "/moehost", "/nothing"} {
		for _, keysOnly := range []bool{false, true} {
			q := dsq.Query{Prefix: prefix, KeysOnly: keysOnly}
			got, want := keys(st, q), keys(ref, q)
			if !slices.Equal(got, want) {
				t.Errorf("Query(%q, keys only %v) = %d entries %v, want %d %v", prefix, keysOnly, len(got), got, len(want), want)
			}
			if prefix == sets[0] && len(got) != 2 {
				t.Errorf("Query(%q) = %d entries, want 2", prefix, len(got))
			}
			if prefix == sets[1] && len(got) != 2 {
				t.Errorf("Query(%q) = %d entries, want 2", prefix, len(got))
			}
		}
	}
}
