package host

import (
	"encoding/binary"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// TestBodyTimeouts checks that the server cuts a request body that stalls
// after WithBodyTimeouts' idle timeout, on ExpertService and on the
// CheckpointService that the server mounts beside it, over gRPC on
// HTTP/2.
func TestBodyTimeouts(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	srv := startTestServer(t, WithoutDHT(), WithBodyTimeouts(idle, 10*time.Second))
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: p}}
	for _, proc := range []string{moehostv1connect.ExpertServiceForwardProcedure, moehostv1connect.CheckpointServiceListProcedure} {
		t.Run(proc, func(t *testing.T) {
			t.Parallel()
			pr, pw := io.Pipe()
			defer pw.Close()
			req, _ := http.NewRequest(http.MethodPost, "http://"+srv.Addr()+proc, pr)
			req.Header.Set("Content-Type", "application/grpc")
			req.Header.Set("Te", "trailers")
			status := make(chan string, 1)
			go func() {
				res, err := client.Do(req)
				if err != nil {
					status <- "error: " + err.Error()
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				status <- res.Header.Get("Grpc-Status") + res.Trailer.Get("Grpc-Status")
			}()
			start := time.Now()
			// A message that declares 100 bytes, and then nothing.
			if _, err := pw.Write(binary.BigEndian.AppendUint32([]byte{0}, 100)); err != nil {
				t.Fatal(err)
			}
			select {
			case got := <-status:
				if took := time.Since(start); got != "4" || took < idle || took > idle+2*time.Second {
					t.Errorf("grpc-status %q after %v; want 4 (DEADLINE_EXCEEDED) after %v", got, took, idle)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stalled body was never cut")
			}
		})
	}
}
