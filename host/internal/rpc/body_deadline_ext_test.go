package rpc_test

import (
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/sdk/wire"
)

// slowExpert is an expert with no inputs or outputs whose Forward takes
// run, or fails with its context's error if the call is cancelled first.
type slowExpert struct {
	run time.Duration
}

func (s slowExpert) Info() *moehostv1.ExpertInfo { return &moehostv1.ExpertInfo{Uid: "slow"} }
func (s slowExpert) Schema() (in, out []*moehostv1.TensorSchema) {
	return nil, nil
}
func (s slowExpert) ForwardWire(ctx context.Context, _ []wire.Raw, _ abi.DType) ([]wire.Raw, error) {
	select {
	case <-time.After(s.run):
		return nil, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
func (s slowExpert) BackwardWire(ctx context.Context, in, _ []wire.Raw, dt abi.DType) ([]wire.Raw, error) {
	return s.ForwardWire(ctx, in, dt)
}

// rawForward starts a Forward whose request body the test writes byte by
// byte, over gRPC on HTTP/2 or the Connect protocol on HTTP/1.1, and
// returns the writer and the call's outcome once the server answers: the
// grpc-status and grpc-message, or the HTTP status and the Connect error.
func rawForward(t *testing.T, base string, grpc bool) (*io.PipeWriter, <-chan string) {
	t.Helper()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, base+moehostv1connect.ExpertServiceForwardProcedure, pr)
	client := http.DefaultClient
	if grpc {
		client = h2c()
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
	} else {
		req.Header.Set("Content-Type", "application/proto")
	}
	out := make(chan string, 1)
	go func() {
		res, err := client.Do(req)
		if err != nil {
			out <- "error: " + err.Error()
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if grpc {
			msg, _ := url.PathUnescape(res.Header.Get("Grpc-Message") + res.Trailer.Get("Grpc-Message"))
			out <- res.Header.Get("Grpc-Status") + res.Trailer.Get("Grpc-Status") + " " + msg
			return
		}
		out <- res.Status + " " + string(body)
	}()
	t.Cleanup(func() { pw.Close() })
	return pw, out
}

// trickleUntilCut writes a byte to pw every every until the call's
// outcome comes from out, and returns it; it fails the test if none comes
// within giveUp.
func trickleUntilCut(t *testing.T, pw *io.PipeWriter, out <-chan string, every, giveUp time.Duration) string {
	t.Helper()
	tick := time.NewTicker(every)
	defer tick.Stop()
	deadline := time.After(giveUp)
	for {
		select {
		case got := <-out:
			return got
		case <-tick.C:
			pw.Write([]byte{'a'})
		case <-deadline:
			t.Fatal("the body was never cut")
		}
	}
}

// TestBodyDeadlines checks that a unary call's body that stalls is cut
// after the idle timeout, and one that trickles (a byte more often than
// the idle timeout) after the total timeout, with DeadlineExceeded and a
// message naming the deadline, over gRPC on HTTP/2 and Connect on
// HTTP/1.1.
func TestBodyDeadlines(t *testing.T) {
	t.Parallel()
	// The trickle writes a byte every idle/10: a goroutine of this test
	// starved for a third of idle under -race on a loaded 2-core machine,
	// and the trickle was cut as idle.
	const idle, total = time.Second, 3 * time.Second
	experts := noExperts{slowExpert{}}
	base := server(t, experts, rpc.Options{Bodies: rpc.BodyLimits{IdleTimeout: idle, Timeout: total}})
	for _, tt := range []struct {
		name    string
		grpc    bool
		every   time.Duration // between bytes; 0: stall after the first
		atLeast time.Duration
		atMost  time.Duration
		want    []string
	}{
		{"gRPC stalled", true, 0, idle, total - 200*time.Millisecond, []string{"4 ", "sent nothing for 1s"}},
		{"gRPC trickling", true, idle / 10, total, total + time.Second, []string{"4 ", "took longer than 3s"}},
		{"Connect stalled", false, 0, idle, total - 200*time.Millisecond, []string{"504 ", "deadline_exceeded", "sent nothing for 1s"}},
		{"Connect trickling", false, idle / 10, total, total + time.Second, []string{"504 ", "deadline_exceeded", "took longer than 3s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pw, out := rawForward(t, base, tt.grpc)
			start := time.Now()
			// A gRPC message that declares 100 bytes, or the start of
			// a ForwardRequest's uid.
			first := binary.BigEndian.AppendUint32([]byte{0}, 100)
			if !tt.grpc {
				first = []byte{0x0a, 100}
			}
			if _, err := pw.Write(first); err != nil {
				t.Fatal(err)
			}
			every := tt.every
			if every == 0 {
				every = time.Hour
			}
			got := trickleUntilCut(t, pw, out, every, total+3*time.Second)
			took := time.Since(start)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %q after %v; want it to have %q", got, took, w)
				}
			}
			if took < tt.atLeast || took > tt.atMost {
				t.Errorf("cut after %v; want %v to %v", took, tt.atLeast, tt.atMost)
			}
		})
	}
}

// TestBodyMinRate: a body that trickles 10 bytes a second passes its
// idle deadline (1 s between bytes would be needed) and is far from its
// total one, but is cut once MinRateGrace is over, its average below
// MinRate, with DeadlineExceeded and a message that names the rate.
func TestBodyMinRate(t *testing.T) {
	t.Parallel()
	base := server(t, noExperts{slowExpert{}}, rpc.Options{Bodies: rpc.BodyLimits{IdleTimeout: time.Second, Timeout: time.Minute, MinRate: 1024}})
	for _, tt := range []struct {
		name string
		grpc bool
		want []string
	}{
		{"gRPC", true, []string{"4 ", "below the least average rate of 1024 bytes/s"}},
		{"Connect", false, []string{"504 ", "deadline_exceeded", "below the least average rate of 1024 bytes/s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pw, out := rawForward(t, base, tt.grpc)
			start := time.Now()
			first := binary.BigEndian.AppendUint32([]byte{0}, 1000)
			if !tt.grpc {
				first = []byte{0x0a, 100}
			}
			if _, err := pw.Write(first); err != nil {
				t.Fatal(err)
			}
			got := trickleUntilCut(t, pw, out, 100*time.Millisecond, rpc.MinRateGrace+5*time.Second)
			took := time.Since(start)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %q after %v; want it to have %q", got, took, w)
				}
			}
			if took < rpc.MinRateGrace || took > rpc.MinRateGrace+2*time.Second {
				t.Errorf("cut after %v; want %v to %v", took, rpc.MinRateGrace, rpc.MinRateGrace+2*time.Second)
			}
		})
	}
}

// TestBodyDeadlinesEndWithTheBody checks that the body timeouts bound
// only the body: a Forward and a Backward that run for longer than both
// after their body arrived answer, over HTTP/1.1 (where a read deadline
// left on the connection cancels the call once the server's background
// read hits it) and over HTTP/2.
func TestBodyDeadlinesEndWithTheBody(t *testing.T) {
	t.Parallel()
	const idle, total = 200 * time.Millisecond, 400 * time.Millisecond
	experts := noExperts{slowExpert{run: 3 * total}}
	base := server(t, experts, rpc.Options{Bodies: rpc.BodyLimits{IdleTimeout: idle, Timeout: total}})
	for _, tt := range []struct {
		name   string
		client *http.Client
		opts   []connect.ClientOption
	}{
		{"connect over HTTP/1.1", http.DefaultClient, nil},
		// gRPC-Web reads the body once more after its end, to check
		// that the one message is all.
		{"gRPC-Web over HTTP/1.1", http.DefaultClient, []connect.ClientOption{connect.WithGRPCWeb()}},
		{"gRPC over HTTP/2", h2c(), []connect.ClientOption{connect.WithGRPC()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := moehostv1connect.NewExpertServiceClient(tt.client, base, tt.opts...)
			if _, err := c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: "slow"})); err != nil {
				t.Errorf("a Forward that outlasts the body timeouts: %v", err)
			}
			if _, err := c.Backward(context.Background(), connect.NewRequest(&moehostv1.BackwardRequest{Uid: "slow"})); err != nil {
				t.Errorf("a Backward that outlasts the body timeouts: %v", err)
			}
		})
	}
}
