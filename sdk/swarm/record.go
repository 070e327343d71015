package swarm

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
)

// Namespace is the DHT key namespace of moehost records: keys are
// "/moehost/<peer-id>/<name>".
const Namespace = "moehost"

// Bounds on what a record may hold, so that a peer storing a record from a
// stranger pays for a small, bounded thing.
const (
	MaxNameLen = 256
	MaxURLs    = 8
	MaxURLLen  = 512
	// MaxDigestLen fits "sha256:" and 64 hex digits (a 32-byte digest).
	MaxDigestLen = 7 + 64
	// MaxChildren bounds the coordinates one prefix record lists: a grid
	// dimension of more than MaxChildren experts on one server is
	// announced in part (see host/internal/dht).
	MaxChildren = 1024
	// MaxRecordSize bounds a signed value: a record with every field at
	// its bound takes about 10 KB.
	MaxRecordSize = 16 << 10
	// MaxTTL is the longest a record may be valid for, so that nobody can
	// keep a dead server in the swarm by announcing it "forever".
	MaxTTL = 24 * time.Hour
)

// signaturePrefix separates record signatures from any other use of a
// peer's key.
var signaturePrefix = []byte("moehost-dht-record:")

// ErrInvalidRecord is wrapped by every validation failure.
var ErrInvalidRecord = errors.New("invalid record")

// nameRE matches uids ("ffn.3.14", "expert_a") and grid prefixes ("ffn.",
// "ffn.3."): dot-separated segments of letters, digits, "_" and "-".
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?$`)

// ValidName reports whether name may be announced: a uid or a prefix.
func ValidName(name string) bool { return len(name) <= MaxNameLen && nameRE.MatchString(name) }

// IsPrefix reports whether name is a grid prefix (it ends with ".").
func IsPrefix(name string) bool { return strings.HasSuffix(name, ".") }

// Record is one server's entry for one uid or prefix.
type Record struct {
	// Name is a uid ("ffn.3.14") or a grid prefix ("ffn.3.").
	Name string
	// PeerID is the announcing server's peer ID.
	PeerID string
	// URLs are the server's public base URLs (a uid's record only).
	URLs []string
	// Digest is the module digest of the expert (a uid's record only).
	Digest string
	// Expires is when the record stops being valid.
	Expires time.Time
	// QueueDepth and SamplesPerSecond are the expert's load.
	QueueDepth       int64
	SamplesPerSecond float64
	// Children are the coordinates the server hosts right under a prefix.
	Children []int32
	// StateRoot is the state root ("sha256:<hex>") of the expert's latest
	// checkpoint on the server, and StateStep its step (a uid's record
	// only; "" when it has none). The server serves that state over
	// /moehost/blob/1.0.0 to the peers it lets pull it.
	StateRoot string
	StateStep int64
}

// Live reports whether the record announces something: a uid's record
// with a URL, or a prefix's with a child. A server withdraws a name by
// announcing it empty (see Node.Withdraw).
func (r Record) Live() bool {
	if IsPrefix(r.Name) {
		return len(r.Children) > 0
	}
	return len(r.URLs) > 0
}

// Key returns the DHT key of a record: "/moehost/<peerID>/<name>".
func Key(peerID, name string) string { return "/" + Namespace + "/" + peerID + "/" + name }

// Identity is a server's or client's libp2p key pair. The zero value is
// not usable; make one with NewIdentity or ParseIdentity.
type Identity struct {
	priv crypto.PrivKey
	id   peer.ID
}

// NewIdentity makes a fresh Ed25519 identity.
func NewIdentity() (*Identity, error) {
	priv, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	return identityOf(priv)
}

// ParseIdentity reads an identity written by Identity.Marshal.
func ParseIdentity(b []byte) (*Identity, error) {
	priv, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("parsing identity: %w", err)
	}
	return identityOf(priv)
}

func identityOf(priv crypto.PrivKey) (*Identity, error) {
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("peer ID of key: %w", err)
	}
	return &Identity{priv: priv, id: id}, nil
}

// Marshal encodes the private key, for keeping it in a file.
func (i *Identity) Marshal() ([]byte, error) { return crypto.MarshalPrivateKey(i.priv) }

// PeerID returns the identity's peer ID.
func (i *Identity) PeerID() string { return i.id.String() }

// Sign encodes r as a signed DHT value. r.PeerID is set to the identity's.
func (i *Identity) Sign(r Record) ([]byte, error) {
	r.PeerID = i.PeerID()
	return i.sign(r)
}

// sign signs r as it is.
func (i *Identity) sign(r Record) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(&moehostv1.DHTRecord{
		Name: r.Name, PeerId: r.PeerID, Urls: r.URLs, Digest: r.Digest,
		ExpiresUnixMs: r.Expires.UnixMilli(), QueueDepth: r.QueueDepth,
		SamplesPerSecond: r.SamplesPerSecond, Children: r.Children,
		StateRoot: r.StateRoot, StateStep: r.StateStep,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding record: %w", err)
	}
	sig, err := i.priv.Sign(append(bytes.Clone(signaturePrefix), body...))
	if err != nil {
		return nil, fmt.Errorf("signing record: %w", err)
	}
	pub, err := crypto.MarshalPublicKey(i.priv.GetPublic())
	if err != nil {
		return nil, fmt.Errorf("encoding public key: %w", err)
	}
	return proto.Marshal(&moehostv1.SignedDHTRecord{Record: body, PublicKey: pub, Signature: sig})
}

// Decode checks a DHT value stored under key and returns its record. It
// rejects malformed values, bad signatures, a signer that is not the peer
// the record and the key name, a name the key does not name, and records
// that expired (or claim to live longer than MaxTTL) at now.
func Decode(key string, value []byte, now time.Time) (Record, error) {
	bad := func(format string, args ...any) (Record, error) {
		return Record{}, fmt.Errorf("%w: %s", ErrInvalidRecord, fmt.Sprintf(format, args...))
	}
	if len(value) > MaxRecordSize {
		return bad("%d bytes, more than %d", len(value), MaxRecordSize)
	}
	rest, ok := strings.CutPrefix(key, "/"+Namespace+"/")
	if !ok {
		return bad("key %q is not in namespace %q", key, Namespace)
	}
	keyPeer, name, ok := strings.Cut(rest, "/")
	if !ok || !ValidName(name) {
		return bad("key %q does not name a peer and a valid uid or prefix", key)
	}
	var signed moehostv1.SignedDHTRecord
	if err := proto.Unmarshal(value, &signed); err != nil {
		return bad("decoding: %v", err)
	}
	pub, err := crypto.UnmarshalPublicKey(signed.GetPublicKey())
	if err != nil {
		return bad("public key: %v", err)
	}
	signer, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return bad("public key: %v", err)
	}
	if signer.String() != keyPeer {
		return bad("signed by %s, but the key names peer %s", signer, keyPeer)
	}
	ok, err = pub.Verify(append(bytes.Clone(signaturePrefix), signed.GetRecord()...), signed.GetSignature())
	if err != nil || !ok {
		return bad("signature does not verify")
	}
	var body moehostv1.DHTRecord
	if err := proto.Unmarshal(signed.GetRecord(), &body); err != nil {
		return bad("decoding body: %v", err)
	}
	switch {
	case body.GetPeerId() != keyPeer:
		return bad("record names peer %q, but it is signed by %s", body.GetPeerId(), keyPeer)
	case body.GetName() != name:
		return bad("record names %q, but its key names %q", body.GetName(), name)
	case len(body.GetUrls()) > MaxURLs:
		return bad("%d urls, more than %d", len(body.GetUrls()), MaxURLs)
	case len(body.GetDigest()) > MaxDigestLen:
		return bad("digest of %d bytes, more than %d", len(body.GetDigest()), MaxDigestLen)
	case len(body.GetChildren()) > MaxChildren:
		return bad("%d children, more than %d", len(body.GetChildren()), MaxChildren)
	case math.IsNaN(body.GetSamplesPerSecond()) || body.GetSamplesPerSecond() < 0 || body.GetQueueDepth() < 0:
		return bad("negative or NaN load")
	case body.GetStateRoot() != "" && !validRoot(body.GetStateRoot()):
		return bad("state root %.80q is not sha256:<64 hex digits>", body.GetStateRoot())
	case body.GetStateStep() < 0 || body.GetStateRoot() == "" && body.GetStateStep() != 0:
		return bad("state step %d without a root, or negative", body.GetStateStep())
	}
	for _, u := range body.GetUrls() {
		if len(u) > MaxURLLen || !(strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) {
			return bad("url %.64q is not an http(s) URL of at most %d bytes", u, MaxURLLen)
		}
	}
	for _, c := range body.GetChildren() {
		if c < 0 {
			return bad("negative child coordinate %d", c)
		}
	}
	expires := time.UnixMilli(body.GetExpiresUnixMs())
	if !expires.After(now) {
		return bad("expired at %s", expires.UTC().Format(time.RFC3339Nano))
	}
	if expires.Sub(now) > MaxTTL {
		return bad("expires in %s, more than %s", expires.Sub(now).Round(time.Second), MaxTTL)
	}
	return Record{
		Name: name, PeerID: keyPeer, URLs: body.GetUrls(), Digest: body.GetDigest(), Expires: expires,
		QueueDepth: body.GetQueueDepth(), SamplesPerSecond: body.GetSamplesPerSecond(), Children: body.GetChildren(),
		StateRoot: body.GetStateRoot(), StateStep: body.GetStateStep(),
	}, nil
}

// validRoot reports whether s is "sha256:" and 64 lowercase hex digits.
func validRoot(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Validator is the DHT record validator of the moehost namespace, used by
// servers and clients alike: peers refuse to store what it rejects, and
// lookups drop it.
type Validator struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (v Validator) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// Validate implements the libp2p record validator: see Decode.
func (v Validator) Validate(key string, value []byte) error {
	_, err := Decode(key, value, v.now())
	return err
}

// Select picks the valid value that expires last (the newest
// announcement), the first one on a tie.
func (v Validator) Select(key string, values [][]byte) (int, error) {
	best, bestExp := -1, time.Time{}
	now := v.now()
	for i, val := range values {
		r, err := Decode(key, val, now)
		if err != nil {
			continue
		}
		if best < 0 || r.Expires.After(bestExp) {
			best, bestExp = i, r.Expires
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%w: none of %d values is valid", ErrInvalidRecord, len(values))
	}
	return best, nil
}
