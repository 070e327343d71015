package blob_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/blob"
	"github.com/moehost/moehost/sdk/swarm"
)

// node adapts a swarm node to blob.Host, as package host does.
type node struct{ *swarm.Node }

func (n node) Handle(p string, fn func(string, blob.Stream)) {
	n.HandleStream(p, func(peer string, s swarm.Stream) { fn(peer, s) })
}

func (n node) Open(ctx context.Context, peer, p string) (blob.Stream, error) {
	return n.OpenStream(ctx, peer, p)
}

// source serves one checkpoint store's latest checkpoint of ffn.0; flip
// and forge make it a hostile holder, slow a throttled one.
type source struct {
	st    *checkpoint.Store
	sm    *checkpoint.SignedManifest
	flip  bool          // flips a byte of every chunk it serves
	forge bool          // serves another manifest under the root
	slow  time.Duration // sleeps before each read
}

func (s *source) State(root string) ([]byte, *checkpoint.Manifest, error) {
	if root != s.sm.Root {
		return nil, nil, checkpoint.ErrNotFound
	}
	enc := s.sm.Encoded
	if s.forge {
		m, _ := checkpoint.DecodeManifest(enc)
		m.Step++
		enc = m.Encode()
	}
	return checkpoint.EncodeSigned(enc, s.sm.PublicKey, s.sm.Signature), s.sm.Manifest, nil
}

type flipFile struct {
	*os.File
	s *source
}

func (f flipFile) ReadAt(b []byte, off int64) (int, error) {
	if f.s.slow > 0 {
		time.Sleep(f.s.slow)
	}
	n, err := f.File.ReadAt(b, off)
	if f.s.flip && n > 0 {
		b[n/2] ^= 0x10
	}
	return n, err
}

func (s *source) OpenFile(root string, i int) (blob.File, error) {
	f, err := os.Open(s.st.Path("ffn.0", s.sm.Manifest.Files[i].Name))
	return flipFile{f, s}, err
}

func (s *source) Module(string) ([]byte, []string, error) { return nil, nil, checkpoint.ErrNotFound }

// bigCheckpoint spans 5 chunks in its parameter file, the last short.
func bigCheckpoint() *checkpoint.Checkpoint {
	n := (4*checkpoint.ChunkSize + 5000) / 4
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(i%1013) - 7
	}
	return &checkpoint.Checkpoint{
		Meta:   checkpoint.Meta{UID: "ffn.0", ModuleDigest: "sha256:ab", Step: 20, Examples: 40, Optimizer: "{}"},
		Params: []checkpoint.Tensor{{Name: "w", Shape: []int{n}, Data: w}},
		Optim:  []checkpoint.Tensor{{Name: "w.exp_avg", Shape: []int{3}, Data: []float32{1, 2, 3}}},
	}
}

// swarmOf starts holders serving src[i] each, allowing allow, and a
// puller node joined to them all.
func swarmOf(t *testing.T, allow func(peer, uid string) bool, srcs ...*source) (*blob.Puller, node, []string) {
	t.Helper()
	ctx := context.Background()
	var ids, addrs []string
	for _, src := range srcs {
		n, err := swarm.NewNode(ctx, swarm.Config{Listen: []string{"/ip4/127.0.0.1/tcp/0"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		srv := blob.NewServer(blob.Config{Source: src, Allow: allow})
		node{n}.Handle(blob.Protocol, srv.Serve)
		ids = append(ids, n.PeerID())
		addrs = append(addrs, n.Addrs()...)
	}
	pn, err := swarm.NewNode(ctx, swarm.Config{Client: true, Listen: []string{"/ip4/127.0.0.1/tcp/0"}, InitialPeers: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pn.Close() })
	for _, a := range addrs {
		if err := pn.Connect(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	return blob.NewPuller(node{pn}), node{pn}, ids
}

func saved(t *testing.T) (*checkpoint.Store, *checkpoint.SignedManifest) {
	t.Helper()
	st, err := checkpoint.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := st.SaveManifest(bigCheckpoint())
	if err != nil {
		t.Fatal(err)
	}
	return st, sm
}

func everyone(string, string) bool { return true }

// checkFiles compares the pulled files with the source's, byte for byte.
func checkFiles(t *testing.T, st *checkpoint.Store, sm *checkpoint.SignedManifest, dir string) {
	t.Helper()
	for _, f := range sm.Manifest.Files {
		want, _ := os.ReadFile(st.Path("ffn.0", f.Name))
		got, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: pulled %d bytes (%v), want the source's %d", f.Name, len(got), err, len(want))
		}
	}
}

func part(dir string) func(string) string {
	return func(name string) string { return filepath.Join(dir, name) }
}

func TestPullOneHolder(t *testing.T) {
	t.Parallel()
	st, sm := saved(t)
	p, _, ids := swarmOf(t, everyone, &source{st: st, sm: sm})
	ctx := context.Background()
	got, err := p.Manifest(ctx, sm.Root, ids)
	if err != nil || !blob.Equal(got, sm) {
		t.Fatalf("manifest: %v", err)
	}
	dir := t.TempDir()
	if err := p.Files(ctx, got, ids, part(dir)); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, st, sm, dir)
	// An unknown root is NotFound, at once.
	start := time.Now()
	_, err = p.Manifest(ctx, "sha256:"+string(bytes.Repeat([]byte("0"), 64)), ids)
	if !errors.Is(err, blob.ErrNotFound) || time.Since(start) > time.Second {
		t.Errorf("unknown root: %v after %s, want NotFound at once", err, time.Since(start))
	}
}

// TestPermission checks both directions: a peer the holder allows gets
// the state, one it does not gets PermissionDenied for the manifest and
// for chunks.
func TestPermission(t *testing.T) {
	t.Parallel()
	st, sm := saved(t)
	var allowed string
	p, pn, ids := swarmOf(t, func(peer, uid string) bool { return peer == allowed && uid == "ffn.0" }, &source{st: st, sm: sm})
	ctx := context.Background()
	if _, err := p.Manifest(ctx, sm.Root, ids); !errors.Is(err, blob.ErrPermissionDenied) {
		t.Fatalf("untrusted manifest: %v, want PermissionDenied", err)
	}
	if err := p.Files(ctx, sm, ids, part(t.TempDir())); !errors.Is(err, blob.ErrPermissionDenied) {
		t.Fatalf("untrusted chunks: %v, want PermissionDenied", err)
	}
	allowed = pn.PeerID()
	if _, err := p.Manifest(ctx, sm.Root, ids); err != nil {
		t.Fatalf("trusted manifest: %v", err)
	}
}

// TestPullRejectsCorruption: one holder flips a byte in every chunk,
// another forges the manifest; both are banned and the pull ends right
// from the honest one. Without an honest holder it fails, saying why.
func TestPullRejectsCorruption(t *testing.T) {
	t.Parallel()
	st, sm := saved(t)
	p, _, ids := swarmOf(t, everyone, &source{st: st, sm: sm, forge: true}, &source{st: st, sm: sm, flip: true}, &source{st: st, sm: sm})
	ctx := context.Background()
	got, err := p.Manifest(ctx, sm.Root, ids)
	if err != nil || !blob.Equal(got, sm) {
		t.Fatalf("manifest: %v", err)
	}
	if p.Banned(ids[0]) == nil {
		t.Error("the forger is not banned")
	}
	dir := t.TempDir()
	if err := p.Files(ctx, got, ids[1:], part(dir)); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, st, sm, dir)
	if p.Banned(ids[1]) == nil || p.Banned(ids[2]) != nil {
		t.Errorf("bans: flipper %v, honest %v", p.Banned(ids[1]), p.Banned(ids[2]))
	}
	// No honest holder.
	p2, _, bad := swarmOf(t, everyone, &source{st: st, sm: sm, flip: true})
	err = p2.Files(ctx, sm, bad, part(t.TempDir()))
	if !errors.Is(err, blob.ErrBadData) {
		t.Errorf("only a corrupt holder: %v, want ErrBadData", err)
	}
	p3, _, forger := swarmOf(t, everyone, &source{st: st, sm: sm, forge: true})
	if _, err := p3.Manifest(ctx, sm.Root, forger); !errors.Is(err, blob.ErrBadData) {
		t.Errorf("only a forger: %v, want ErrBadData", err)
	}
}

// TestPullResumes cuts a pull at 40% of the bytes and resumes it: the
// bytes received in all are at most the files plus one chunk.
func TestPullResumes(t *testing.T) {
	t.Parallel()
	st, sm := saved(t)
	p, _, ids := swarmOf(t, everyone, &source{st: st, sm: sm, slow: 20 * time.Millisecond})
	p.StreamsPerHolder, p.RangeChunks = 1, 1
	total := sm.Manifest.Bytes()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for p.Received() < total*4/10 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if err := p.Files(ctx, sm, ids, part(dir)); err == nil {
		t.Fatal("the cut pull succeeded")
	}
	cut := p.Received()
	if cut >= total {
		t.Fatalf("the cut came after %d of %d bytes", cut, total)
	}
	if err := p.Files(context.Background(), sm, ids, part(dir)); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, st, sm, dir)
	if got, limit := p.Received(), total+checkpoint.ChunkSize; got > limit {
		t.Errorf("received %d bytes in all (cut at %d), more than the files %d plus a chunk", got, cut, total)
	}
	t.Logf("cut at %d of %d; %d received in all", cut, total, p.Received())
}

// TestPullStripes pulls from three holders, one throttled ten times as
// much: chunks come from all three, and the throttled one serves less
// than each other.
func TestPullStripes(t *testing.T) {
	t.Parallel()
	st, sm := saved(t)
	// The fast holders take 40 ms a range too: at loopback speed one
	// of them drained the few ranges before the other's stream opened,
	// and served none.
	p, _, ids := swarmOf(t, everyone, &source{st: st, sm: sm, slow: 40 * time.Millisecond}, &source{st: st, sm: sm, slow: 40 * time.Millisecond},
		&source{st: st, sm: sm, slow: 400 * time.Millisecond})
	p.StreamsPerHolder, p.RangeChunks = 1, 1
	dir := t.TempDir()
	if err := p.Files(context.Background(), sm, ids, part(dir)); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, st, sm, dir)
	a, b, slow := p.ReceivedFrom(ids[0]), p.ReceivedFrom(ids[1]), p.ReceivedFrom(ids[2])
	if a == 0 || b == 0 || slow == 0 {
		t.Errorf("bytes by holder %d %d %d: every holder should serve", a, b, slow)
	}
	if slow >= a || slow >= b {
		t.Errorf("the throttled holder served %d, the others %d and %d", slow, a, b)
	}
}
