package rpc_test

import (
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
)

// rawGRPCUpload starts an UploadModule call over gRPC whose request body
// the test writes byte by byte, and returns the writer and the call's
// grpc-status, which arrives once the server ends the stream.
func rawGRPCUpload(t *testing.T, url string) (*io.PipeWriter, <-chan string) {
	t.Helper()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, url+moehostv1connect.ModuleServiceUploadModuleProcedure, pr)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	status := make(chan string, 1)
	go func() {
		res, err := h2c().Do(req)
		if err != nil {
			status <- "error: " + err.Error()
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		status <- res.Header.Get("Grpc-Status") + res.Trailer.Get("Grpc-Status")
	}()
	t.Cleanup(func() { pw.Close() })
	return pw, status
}

// TestUploadDeadlines checks that an upload that stalls is cut after the
// idle timeout, and one that trickles (a byte more often than the idle
// timeout) after the total timeout, both with DeadlineExceeded, while a
// prompt upload passes.
func TestUploadDeadlines(t *testing.T) {
	t.Parallel()
	const idle, total = 300 * time.Millisecond, 1500 * time.Millisecond
	fake := &fakeModules{}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake, Uploads: rpc.UploadLimits{IdleTimeout: idle, Timeout: total}})
	// A message that declares 100 bytes of UploadModuleRequest.
	header := binary.BigEndian.AppendUint32([]byte{0}, 100)
	for _, tt := range []struct {
		name      string
		every     time.Duration // between bytes; 0: stall after the header
		atLeast   time.Duration
		atMost    time.Duration
		wantState string
	}{
		{"stalled", 0, idle, total - 200*time.Millisecond, "4"}, // DEADLINE_EXCEEDED
		{"trickling", idle / 3, total, total + time.Second, "4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pw, status := rawGRPCUpload(t, url)
			start := time.Now()
			if _, err := pw.Write(header); err != nil {
				t.Fatal(err)
			}
			var got string
			every := tt.every
			if every == 0 {
				every = time.Hour
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			giveUp := time.After(total + 3*time.Second)
		wait:
			for {
				select {
				case got = <-status:
					break wait
				case <-tick.C:
					pw.Write([]byte{0x0a})
				case <-giveUp:
					t.Fatal("the upload was never cut")
				}
			}
			took := time.Since(start)
			if got != tt.wantState || took < tt.atLeast || took > tt.atMost {
				t.Errorf("grpc-status %q after %v; want %q after %v to %v", got, took, tt.wantState, tt.atLeast, tt.atMost)
			}
		})
	}
	t.Run("prompt", func(t *testing.T) {
		t.Parallel()
		c := moehostv1connect.NewModuleServiceClient(h2c(), url, connect.WithGRPC(), connect.WithInterceptors(withToken("Bearer "+aliceToken)))
		stream := c.UploadModule(context.Background())
		for range 3 {
			if err := stream.Send(&moehostv1.UploadModuleRequest{Chunk: []byte("abc")}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(idle / 3)
		}
		if _, err := stream.CloseAndReceive(); err != nil {
			t.Errorf("a prompt upload: %v", err)
		}
	})
}

// TestUploadDeadlinesEndWithTheBody checks that the idle and total
// timeouts bound only the body: a module whose compile outlasts both
// after its last byte arrived is stored, over HTTP/1.1 (where a read
// deadline left on the connection cancels the call once the server's
// background read hits it) and over HTTP/2.
func TestUploadDeadlinesEndWithTheBody(t *testing.T) {
	t.Parallel()
	const idle, total = 200 * time.Millisecond, 400 * time.Millisecond
	fake := &fakeModules{compile: 3 * total}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake, Uploads: rpc.UploadLimits{IdleTimeout: idle, Timeout: total}})
	for _, tt := range []struct {
		name   string
		client *http.Client
		opts   []connect.ClientOption
	}{
		{"connect over HTTP/1.1", http.DefaultClient, nil},
		{"gRPC over HTTP/2", h2c(), []connect.ClientOption{connect.WithGRPC()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := moehostv1connect.NewModuleServiceClient(tt.client, url, append(tt.opts, connect.WithInterceptors(withToken("Bearer "+aliceToken)))...)
			stream := c.UploadModule(context.Background())
			if err := stream.Send(&moehostv1.UploadModuleRequest{Name: "slow", Chunk: []byte("abc")}); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.CloseAndReceive(); err != nil {
				t.Errorf("an upload whose compile outlasts the upload timeouts: %v", err)
			}
		})
	}
}
