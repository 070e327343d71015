package checkpoint_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/sdk/swarm"
)

// bigCheckpoint is a checkpoint whose parameter file spans several
// chunks, the last one short.
func bigCheckpoint(step int64) *checkpoint.Checkpoint {
	n := 2*checkpoint.ChunkSize/4 + 1000
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(i%977) * float32(step+1)
	}
	return &checkpoint.Checkpoint{
		Meta: checkpoint.Meta{UID: "ffn.0", ModuleDigest: "sha256:" + string(bytes.Repeat([]byte("ab"), 32)), Step: step,
			Examples: 10 * step, Config: map[string]int64{"hidden_dim": 8, "a": -3}, Optimizer: `{"name":"adam"}`},
		Params: []checkpoint.Tensor{{Name: "w", Shape: []int{n}, Data: w}},
		Optim:  []checkpoint.Tensor{{Name: "w.exp_avg", Shape: []int{2}, Data: []float32{1, 2}}},
	}
}

// TestSaveWritesManifest checks that Save's manifest describes the files
// on disk chunk by chunk (rehashed here from the files), that it is
// signed by the store's signer, chains to the previous step, and that a
// checkpoint without a manifest gets one equal to what Save wrote.
func TestSaveWritesManifest(t *testing.T) {
	t.Parallel()
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := checkpoint.Open(dir, 0, checkpoint.WithSigner(id))
	if err != nil {
		t.Fatal(err)
	}
	first, err := st.SaveManifest(bigCheckpoint(3))
	if err != nil {
		t.Fatal(err)
	}
	sm, err := st.SaveManifest(bigCheckpoint(5))
	if err != nil {
		t.Fatal(err)
	}
	m := sm.Manifest
	if m.UID != "ffn.0" || m.Step != 5 || m.Examples != 50 || m.Config["hidden_dim"] != 8 || m.Config["a"] != -3 ||
		m.Optimizer != `{"name":"adam"}` || m.ModuleDigest != bigCheckpoint(5).ModuleDigest {
		t.Errorf("manifest fields %+v", m)
	}
	if m.Parent != first.Root || first.Manifest.Parent != "" {
		t.Errorf("parent %q, want %q (the first's is %q)", m.Parent, first.Root, first.Manifest.Parent)
	}
	if len(m.Files) != 2 || m.Files[0].Name != "5.optim.safetensors" || m.Files[1].Name != "5.safetensors" {
		t.Fatalf("files %+v", m.Files)
	}
	for _, f := range m.Files {
		b, err := os.ReadFile(filepath.Join(dir, "ffn.0", f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if f.Size != int64(len(b)) || f.ChunkSize != checkpoint.ChunkSize || int64(len(f.Chunks)) != checkpoint.NumChunks(f.Size, f.ChunkSize) {
			t.Fatalf("%s: size %d chunk %d chunks %d; file is %d bytes", f.Name, f.Size, f.ChunkSize, len(f.Chunks), len(b))
		}
		for i := range f.Chunks {
			off, n := f.Chunk(int64(i))
			if sha256.Sum256(b[off:off+n]) != f.Chunks[i] {
				t.Errorf("%s chunk %d: hash differs from the file's bytes", f.Name, i)
			}
		}
	}
	if len(m.Files[1].Chunks) != 3 {
		t.Errorf("parameter file has %d chunks, want 3", len(m.Files[1].Chunks))
	}
	signer, err := swarm.VerifyState(sm.Root, sm.PublicKey, sm.Signature)
	if err != nil || signer != id.PeerID() {
		t.Errorf("signature: signer %q err %v, want %s", signer, err, id.PeerID())
	}
	if _, err := swarm.VerifyState(first.Root, sm.PublicKey, sm.Signature); err == nil {
		t.Error("step 5's signature verifies step 3's root")
	}
	// The manifest on disk reads back the same.
	got, err := st.Manifest("ffn.0", 5)
	if err != nil || got.Root != sm.Root {
		t.Fatalf("Manifest: %v root %v, want %s", err, got, sm.Root)
	}
	// Without its manifest file, a checkpoint's manifest is rebuilt
	// from the files: the same root.
	if err := os.Remove(filepath.Join(dir, "ffn.0", "5.manifest")); err != nil {
		t.Fatal(err)
	}
	again, err := st.Manifest("ffn.0", 5)
	if err != nil || again.Root != sm.Root {
		t.Fatalf("rebuilt manifest: %v, root %v want %s", err, again, sm.Root)
	}
}

// TestManifestEncoding checks that the encoding is deterministic (a map
// in any order encodes the same), that any change of a field changes
// the root, and that the decoder refuses what Encode would not write.
func TestManifestEncoding(t *testing.T) {
	t.Parallel()
	st, err := checkpoint.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := st.SaveManifest(bigCheckpoint(1))
	if err != nil {
		t.Fatal(err)
	}
	m := sm.Manifest
	for range 20 {
		cp := *m
		cp.Config = map[string]int64{}
		for k, v := range m.Config {
			cp.Config[k] = v
		}
		if !bytes.Equal(cp.Encode(), sm.Encoded) {
			t.Fatal("encoding depends on map order")
		}
	}
	dec, err := checkpoint.DecodeManifest(sm.Encoded)
	if err != nil || dec.Root() != sm.Root {
		t.Fatalf("decode: %v", err)
	}
	changes := []struct {
		name string
		fn   func(*checkpoint.Manifest)
	}{
		{"uid", func(m *checkpoint.Manifest) { m.UID = "ffn.1" }},
		{"digest", func(m *checkpoint.Manifest) { m.ModuleDigest = "sha256:00" }},
		{"step", func(m *checkpoint.Manifest) { m.Step++ }},
		{"examples", func(m *checkpoint.Manifest) { m.Examples++ }},
		{"optimizer", func(m *checkpoint.Manifest) { m.Optimizer = "{}" }},
		{"parent", func(m *checkpoint.Manifest) { m.Parent = "sha256:11" }},
		{"config", func(m *checkpoint.Manifest) { m.Config = map[string]int64{"hidden_dim": 9, "a": -3} }},
		{"size", func(m *checkpoint.Manifest) { m.Files[0].Size++ }},
		{"chunk", func(m *checkpoint.Manifest) { m.Files[1].Chunks[2][7] ^= 1 }},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			cp, err := checkpoint.DecodeManifest(sm.Encoded)
			if err != nil {
				t.Fatal(err)
			}
			c.fn(cp)
			if cp.Root() == sm.Root {
				t.Errorf("changing %s keeps the root", c.name)
			}
		})
	}
	bad := map[string][]byte{
		"empty":           nil,
		"truncated":       sm.Encoded[:len(sm.Encoded)-1],
		"trailing":        append(bytes.Clone(sm.Encoded), 0),
		"bad magic":       append([]byte("x"), sm.Encoded[1:]...),
		"huge chunk list": append([]byte("moehost-manifest/1\n\x00\x00\x00\x00\x00\x00\x00\x01\x01a\xff\xff\xff\xff\x0f\x80\x80\x40\xff\xff\xff\xff\x0f"), 0),
	}
	for name, b := range bad {
		if _, err := checkpoint.DecodeManifest(b); !errors.Is(err, checkpoint.ErrBadManifest) {
			t.Errorf("%s: err %v, want ErrBadManifest", name, err)
		}
	}
}

// FuzzDecodeManifest feeds the manifest decoders bytes off the wire: they
// never panic, never allocate past the bytes given, and what they accept
// re-encodes to the same bytes.
func FuzzDecodeManifest(f *testing.F) {
	st, err := checkpoint.Open(f.TempDir(), 0)
	if err != nil {
		f.Fatal(err)
	}
	sm, err := st.SaveManifest(bigCheckpoint(2))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sm.Encoded)
	f.Add(checkpoint.EncodeSigned(sm.Encoded, []byte("pub"), []byte("sig")))
	f.Add([]byte("moehost-manifest/1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := checkpoint.DecodeManifest(b); err == nil {
			if !bytes.Equal(m.Encode(), b) {
				t.Fatal("accepted bytes re-encode differently")
			}
		}
		if s, err := checkpoint.DecodeSigned(b); err == nil {
			if !bytes.Equal(checkpoint.EncodeSigned(s.Encoded, s.PublicKey, s.Signature), b) {
				t.Fatal("accepted signed bytes re-encode differently")
			}
		}
	})
}
