package rpc_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/rpc"
	"github.com/moehost/moehost/internal/gzipbomb"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestGzipBombStopsAtTheLimit sends 1 GiB of zeros in about 1 MiB of
// gzip to a server whose request limit is 1 MiB, over the Connect
// protocol (a compressed body) and gRPC (a compressed message), and
// checks that each is refused with resource_exhausted after inflating
// about the limit, not the whole GiB (connect's own decompressor inflates
// it all to report its size: about a second of CPU).
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
			before := cpuTime()
			res, err := h2c().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			spent := cpuTime() - before
			got := string(body) + res.Header.Get("Grpc-Status") + res.Trailer.Get("Grpc-Status")
			if !strings.Contains(got, tt.want) {
				t.Errorf("answer %d %q (grpc-status %q %q), want %q", res.StatusCode, body, res.Header.Get("Grpc-Status"), res.Trailer.Get("Grpc-Status"), tt.want)
			}
			// Inflating 1 MiB takes about a millisecond; the whole GiB
			// about a second. The bound leaves room for a loaded machine.
			t.Logf("CPU spent on the request: %v", spent)
			if spent > 250*time.Millisecond {
				t.Errorf("the request cost %v of CPU: the bomb was inflated past the limit", spent)
			}
		})
	}
}
