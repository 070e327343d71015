package blob_test

import (
	"bufio"
	"bytes"
	"errors"
	"testing"

	"github.com/moehost/moehost/host/internal/blob"
)

func TestRequestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range []blob.Request{
		{Kind: blob.KindManifest, Name: "sha256:00"},
		{Kind: blob.KindModule, Name: "sha256:ab"},
		{Kind: blob.KindChunks, Name: "sha256:cd", File: 1, First: 300, Count: 8},
	} {
		got, err := blob.ReadRequest(bufio.NewReader(bytes.NewReader(r.Encode())))
		if err != nil || got != r {
			t.Errorf("%+v came back %+v, %v", r, got, err)
		}
	}
	for name, r := range map[string]blob.Request{
		"no chunks":    {Kind: blob.KindChunks, Name: "x", Count: 0},
		"many chunks":  {Kind: blob.KindChunks, Name: "x", Count: blob.MaxChunksPerRequest + 1},
		"unknown kind": {Kind: 9, Name: "x"},
	} {
		if _, err := blob.ReadRequest(bufio.NewReader(bytes.NewReader(r.Encode()))); !errors.Is(err, blob.ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
}

// FuzzFrames feeds the request and response decoders any bytes: they
// never panic, never read a length they were not bounded to, and a
// request they accept encodes back to the same frame.
func FuzzFrames(f *testing.F) {
	f.Add(blob.Request{Kind: blob.KindChunks, Name: "sha256:cd", File: 1, First: 3, Count: 8}.Encode())
	f.Add(blob.Request{Kind: blob.KindManifest, Name: "sha256:00"}.Encode())
	f.Add([]byte{1, 5, 'h', 'e', 'l', 'l', 'o'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := blob.ReadRequest(bufio.NewReader(bytes.NewReader(b))); err == nil {
			enc := r.Encode()
			if !bytes.Equal(enc, b[:len(enc)]) {
				t.Fatalf("request %+v re-encodes as %x, read from %x", r, enc, b)
			}
		}
		if n, err := blob.ReadResponse(bufio.NewReader(bytes.NewReader(b)), 1<<20); err == nil && (n < 0 || n > 1<<20) {
			t.Fatalf("response length %d past its bound", n)
		}
	})
}
