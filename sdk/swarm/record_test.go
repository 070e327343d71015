package swarm_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/swarm"
)

func mustIdentity(t testing.TB) *swarm.Identity {
	t.Helper()
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// stateRoot is a well-formed state root.
var stateRoot = "sha256:" + strings.Repeat("0123456789abcdef", 4)

func TestDecode(t *testing.T) {
	t.Parallel()
	now := time.Now()
	victim, attacker := mustIdentity(t), mustIdentity(t)
	good := swarm.Record{Name: "ffn.3.14", URLs: []string{"http://10.0.0.1:7700"}, Digest: "sha256:ab", Expires: now.Add(time.Minute), QueueDepth: 2, SamplesPerSecond: 10}
	sign := func(id *swarm.Identity, r swarm.Record) []byte {
		b, err := swarm.SignAs(id, r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	with := func(f func(*swarm.Record)) swarm.Record {
		r := good
		r.PeerID = victim.PeerID()
		f(&r)
		return r
	}
	victimKey := swarm.Key(victim.PeerID(), "ffn.3.14")
	tampered := func() []byte {
		var s moehostv1.SignedDHTRecord
		if err := proto.Unmarshal(sign(victim, with(func(*swarm.Record) {})), &s); err != nil {
			t.Fatal(err)
		}
		var body moehostv1.DHTRecord
		if err := proto.Unmarshal(s.Record, &body); err != nil {
			t.Fatal(err)
		}
		body.Urls = []string{"http://evil:1"}
		s.Record, _ = proto.Marshal(&body)
		b, _ := proto.Marshal(&s)
		return b
	}()
	tests := []struct {
		name    string
		key     string
		value   []byte
		wantErr string // "" for valid
	}{
		{"valid", victimKey, sign(victim, with(func(*swarm.Record) {})), ""},
		{"valid prefix", swarm.Key(victim.PeerID(), "ffn.3."), sign(victim, with(func(r *swarm.Record) { r.Name, r.URLs, r.Children = "ffn.3.", nil, []int32{1, 14} })), ""},
		{"signed by another key", victimKey, sign(attacker, with(func(*swarm.Record) {})), "signed by"},
		{"names another peer", swarm.Key(attacker.PeerID(), "ffn.3.14"), sign(attacker, with(func(*swarm.Record) {})), "names peer"},
		{"tampered body", victimKey, tampered, "signature"},
		{"name differs from key", swarm.Key(victim.PeerID(), "ffn.3.15"), sign(victim, with(func(*swarm.Record) {})), "its key names"},
		{"expired", victimKey, sign(victim, with(func(r *swarm.Record) { r.Expires = now.Add(-time.Millisecond) })), "expired"},
		{"too long-lived", victimKey, sign(victim, with(func(r *swarm.Record) { r.Expires = now.Add(48 * time.Hour) })), "more than"},
		{"not protobuf", victimKey, []byte("\xff\xff\xff"), "decoding"},
		{"empty", victimKey, nil, "public key"},
		{"digest too long", victimKey, sign(victim, with(func(r *swarm.Record) { r.Digest = strings.Repeat("a", 1<<20) })), "bytes, more than"},
		{"non-http url", victimKey, sign(victim, with(func(r *swarm.Record) { r.URLs = []string{"file:///etc/passwd"} })), "http(s)"},
		{"negative load", victimKey, sign(victim, with(func(r *swarm.Record) { r.QueueDepth = -1 })), "load"},
		{"negative child", swarm.Key(victim.PeerID(), "ffn."), sign(victim, with(func(r *swarm.Record) { r.Name, r.Children = "ffn.", []int32{-1} })), "negative child"},
		{"other namespace", "/pk/" + victim.PeerID(), sign(victim, with(func(*swarm.Record) {})), "namespace"},
		{"bad name", swarm.Key(victim.PeerID(), "ffn/3"), sign(victim, with(func(*swarm.Record) {})), "valid uid"},
		{"with state", victimKey, sign(victim, with(func(r *swarm.Record) { r.StateRoot, r.StateStep = stateRoot, 20 })), ""},
		{"bad state root", victimKey, sign(victim, with(func(r *swarm.Record) { r.StateRoot, r.StateStep = "sha256:zz", 20 })), "state root"},
		{"state step without root", victimKey, sign(victim, with(func(r *swarm.Record) { r.StateStep = 20 })), "state step"},
		{"negative state step", victimKey, sign(victim, with(func(r *swarm.Record) { r.StateRoot, r.StateStep = stateRoot, -1 })), "state step"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := swarm.Decode(tt.key, tt.value, now)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if r.PeerID != victim.PeerID() || r.Expires.UnixMilli() != good.Expires.UnixMilli() {
					t.Errorf("decoded %+v", r)
				}
				if tt.name == "with state" && (r.StateRoot != stateRoot || r.StateStep != 20) {
					t.Errorf("state root %q step %d, want %q 20", r.StateRoot, r.StateStep, stateRoot)
				}
				if err := (swarm.Validator{Now: func() time.Time { return now }}).Validate(tt.key, tt.value); err != nil {
					t.Errorf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode accepted it: %+v", r)
			}
			if !errors.Is(err, swarm.ErrInvalidRecord) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want ErrInvalidRecord mentioning %q", err, tt.wantErr)
			}
			if (swarm.Validator{Now: func() time.Time { return now }}).Validate(tt.key, tt.value) == nil {
				t.Error("Validate accepted it")
			}
		})
	}
}

func TestSelectPrefersLatestExpiry(t *testing.T) {
	t.Parallel()
	id := mustIdentity(t)
	now := time.Now()
	var vals [][]byte
	for _, d := range []time.Duration{10, 30, 20} {
		b, err := id.Sign(swarm.Record{Name: "a.1", URLs: []string{"http://x"}, Expires: now.Add(d * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, b)
	}
	vals = append([][]byte{[]byte("junk")}, vals...)
	i, err := swarm.Validator{}.Select(swarm.Key(id.PeerID(), "a.1"), vals)
	if err != nil || i != 2 {
		t.Fatalf("Select = %d, %v; want 2", i, err)
	}
}

func TestIdentityRoundTrip(t *testing.T) {
	t.Parallel()
	id := mustIdentity(t)
	b, err := id.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := swarm.ParseIdentity(b)
	if err != nil || back.PeerID() != id.PeerID() {
		t.Fatalf("ParseIdentity = %v, %v; want %s", back, err, id.PeerID())
	}
	if _, err := swarm.ParseIdentity([]byte("nope")); err == nil {
		t.Error("ParseIdentity accepted junk")
	}
}

// TestWithdrawal: a record without URLs (a uid's) or children (a
// prefix's) is valid but not live, and wins Select against the record it
// withdraws, which expires 1 ms earlier.
func TestWithdrawal(t *testing.T) {
	t.Parallel()
	id, _ := swarm.NewIdentity()
	now := time.Now()
	key := swarm.Key(id.PeerID(), "ffn.0")
	live, _ := id.Sign(swarm.Record{Name: "ffn.0", URLs: []string{"http://x"}, Expires: now.Add(time.Minute)})
	gone, _ := id.Sign(swarm.Record{Name: "ffn.0", Expires: now.Add(time.Minute + time.Millisecond)})
	r, err := swarm.Decode(key, gone, now)
	if err != nil || r.Live() {
		t.Fatalf("withdrawal decoded as %+v, %v; want valid, not live", r, err)
	}
	if i, err := (swarm.Validator{}).Select(key, [][]byte{live, gone}); err != nil || i != 1 {
		t.Errorf("Select = %d, %v; want the withdrawal", i, err)
	}
}

func TestPrefixes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		uid      string
		prefixes []string
		children []int32
	}{
		{"ffn.3.14", []string{"ffn.", "ffn.3."}, []int32{3, 14}},
		{"ffn.0", []string{"ffn."}, []int32{0}},
		{"expert_a", nil, nil},
		{"ffn.x.1", []string{"ffn.x."}, []int32{1}},
		{"alice.ffn.0", []string{"alice.ffn."}, []int32{0}},
		{"me.linear.1.2", []string{"me.linear.", "me.linear.1."}, []int32{1, 2}},
		{"ffn.1.x", nil, nil},
		{"1.2", nil, nil},
		{"ffn.01", nil, nil},
		{"ffn.99999999999", nil, nil},
	}
	for _, tt := range tests {
		p, c := swarm.Prefixes(tt.uid)
		if strings.Join(p, ",") != strings.Join(tt.prefixes, ",") || len(c) != len(tt.children) {
			t.Errorf("Prefixes(%q) = %v, %v; want %v, %v", tt.uid, p, c, tt.prefixes, tt.children)
			continue
		}
		for i := range c {
			if c[i] != tt.children[i] {
				t.Errorf("Prefixes(%q) children = %v, want %v", tt.uid, c, tt.children)
			}
		}
	}
}

func FuzzDecode(f *testing.F) {
	id, err := swarm.NewIdentity()
	if err != nil {
		f.Fatal(err)
	}
	good, _ := id.Sign(swarm.Record{Name: "a.1", URLs: []string{"http://x"}, Expires: time.Now().Add(time.Hour)})
	f.Add(swarm.Key(id.PeerID(), "a.1"), good)
	f.Add("/moehost/x/y", []byte{0x0a, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		r, err := swarm.Decode(key, value, time.Now())
		if err == nil && (r.PeerID == "" || !swarm.ValidName(r.Name)) {
			t.Fatalf("accepted a record without a peer or a valid name: %+v", r)
		}
	})
}

func TestCheckUID(t *testing.T) {
	t.Parallel()
	for uid, ok := range map[string]bool{
		"ffn.0": true, "alice.ffn.3": true, "me.linear.1.2": true, "expert_a": true, "bob.picky": true, "ffn.-1": true,
		"ffn.1.x": false, "ffn.01": false, "ffn.99999999999": false, "0.1": false, "ffn.": false, "": false, "a..b": false,
	} {
		if err := swarm.CheckUID(uid); (err == nil) != ok {
			t.Errorf("CheckUID(%q) = %v, want ok=%v", uid, err, ok)
		}
	}
}

func TestMergeChildren(t *testing.T) {
	t.Parallel()
	a, b, flood := []int32{0, 1}, []int32{1, 2}, []int32{100, 101, 102, 103}
	for _, lists := range [][][]int32{{a, b, flood}, {flood, b, a}} {
		got := swarm.MergeChildren(lists)
		if want := []int32{0, 1, 100, 2, 101, 102, 103}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("MergeChildren(%v) = %v, want %v", lists, got, want)
		}
	}
}

// TestCheckNamePart: a part of a uid is letters, digits, "_" and "-", and
// a refusal names the character (or the empty part).
func TestCheckNamePart(t *testing.T) {
	t.Parallel()
	for part, want := range map[string]string{
		"ffn": "", "Mallory_x-Y9": "", "": "empty part",
		"a b": "contains ' '", "x\n": `contains '\n'`, "\u202egnp": `contains '\u202e'`, "a.b": "contains '.'",
	} {
		err := swarm.CheckNamePart(part)
		if want == "" {
			if err != nil {
				t.Errorf("CheckNamePart(%q) = %v", part, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckNamePart(%q) = %v, want an error containing %q", part, err, want)
		}
		if swarm.ValidName("x."+part) && part != "" && !strings.Contains(part, ".") {
			t.Errorf("ValidName accepts %q, which CheckNamePart refuses: two grammars", "x."+part)
		}
	}
}
