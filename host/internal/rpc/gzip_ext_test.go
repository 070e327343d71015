package rpc_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/internal/testing/gzipbomb"
)

// TestGzipBombStopsAtTheLimit sends 1 GiB of zeros in about 1 MiB of
// gzip to a server whose request limit is 1 MiB, over the Connect
// protocol (a compressed body) and gRPC (a compressed message), and
// checks that each is refused with resource_exhausted after our capped
// decompressor inflated about the limit, not the whole GiB (connect's own
// decompressor inflates it all to report its size: about a second of
// CPU). It counts bytes, not CPU time, so a loaded machine cannot fail it.
func TestGzipBombStopsAtTheLimit(t *testing.T) {
	url := server(t, noExperts{}, rpc.Options{MaxRequestBytes: 1 << 20})
	bomb := gzipbomb.Zeros(960) // under the 1 MiB limit compressed
	t.Logf("960 MiB of zeros is %d bytes of gzip", len(bomb))
	grpcMsg := binary.BigEndian.AppendUint32([]byte{1}, uint32(len(bomb)))
	grpcMsg = append(grpcMsg, bomb...)
	for _, tt := range []struct {
		name, contentType string
		header            map[string]string
		body              []byte
		want              string
	}{
		{"connect", "application/proto", map[string]string{"Content-Encoding": "gzip"}, bomb, "resource_exhausted"},
		{"grpc", "application/grpc", map[string]string{"Grpc-Encoding": "gzip", "Te": "trailers"}, grpcMsg, "8"}, // grpc-status 8: RESOURCE_EXHAUSTED
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, url+moehostv1connect.ExpertServiceForwardProcedure, bytes.NewReader(tt.body))
			req.Header.Set("Content-Type", tt.contentType)
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			before := rpc.InflatedBytes()
			res, err := h2c().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			spent := rpc.InflatedBytes() - before
			got := string(body) + res.Header.Get("Grpc-Status") + res.Trailer.Get("Grpc-Status")
			if !strings.Contains(got, tt.want) {
				t.Errorf("answer %d %q (grpc-status %q %q), want %q", res.StatusCode, body, res.Header.Get("Grpc-Status"), res.Trailer.Get("Grpc-Status"), tt.want)
			}
			t.Logf("the server inflated %d bytes of the bomb", spent)
			const limit, slack = 1 << 20, 64 << 10
			if spent < limit || spent > limit+slack {
				t.Errorf("the server's capped decompressor inflated %d bytes, want the 1 MiB limit (up to %d bytes more): the bomb went past the cap or around it", spent, slack)
			}
		})
	}
}
