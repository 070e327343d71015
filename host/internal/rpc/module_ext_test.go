package rpc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/internal/testing/grpcreflect"
	"github.com/moehost/moehost/sdk/wire"
)

// Tokens of the fake tenants.
const (
	aliceToken    = "alice-secret"
	bobToken      = "bob-secret"
	operatorToken = "operator-secret"
)

// fakeAuth knows alice, bob and the operator.
type fakeAuth struct{}

func (fakeAuth) Authenticate(token string) (rpc.Caller, bool) {
	switch token {
	case aliceToken:
		return rpc.Caller{Tenant: "alice"}, true
	case bobToken:
		return rpc.Caller{Tenant: "bob"}, true
	case operatorToken:
		return rpc.Caller{Operator: true}, true
	}
	return rpc.Caller{}, false
}

// fakeModules is an in-memory Modules that hashes uploads as they stream
// and records what it was asked.
type fakeModules struct {
	mu sync.Mutex
	// err, when set, is what every method returns.
	err error
	// readErr, when set, wraps a failed read of an upload first, as a
	// store that calls every read failure invalid might.
	readErr error
	// compile, when set, is how long Upload works after the body's end,
	// as a store that compiles the module does; a cancelled context
	// ends it early with the context's error.
	compile time.Duration
	// read counts the upload bytes Upload read; maxRead is the largest
	// one Read returned.
	read, maxRead int64
	callers       []rpc.Caller
	deployed      []rpc.Deployment
	uploads       []rpc.ModuleUpload
	mods          map[string][]rpc.ModuleInfo // by tenant
}

func (f *fakeModules) record(c rpc.Caller) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.callers = append(f.callers, c)
	return f.err
}

func (f *fakeModules) BeginUpload(context.Context, rpc.Caller) (func(), error) { return func() {}, nil }

func (f *fakeModules) Upload(ctx context.Context, c rpc.Caller, u rpc.ModuleUpload) (rpc.ModuleInfo, error) {
	if err := f.record(c); err != nil {
		return rpc.ModuleInfo{}, err
	}
	h := sha256.New()
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := u.Body.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		f.mu.Lock()
		f.read += int64(k)
		f.maxRead = max(f.maxRead, int64(k))
		f.mu.Unlock()
		if err == io.EOF {
			break
		}
		if err != nil && f.readErr != nil {
			return rpc.ModuleInfo{}, fmt.Errorf("%w: storing the module: %w", f.readErr, err)
		}
		if err != nil {
			return rpc.ModuleInfo{}, fmt.Errorf("storing the module: %w", err)
		}
	}
	if f.compile > 0 {
		select {
		case <-time.After(f.compile):
		case <-ctx.Done():
			return rpc.ModuleInfo{}, fmt.Errorf("compiling the module: %w", ctx.Err())
		}
	}
	info := rpc.ModuleInfo{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n, Name: u.Name, Created: time.Unix(1700000000, 0)}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uploads = append(f.uploads, rpc.ModuleUpload{Name: u.Name, Size: u.Size})
	if f.mods == nil {
		f.mods = map[string][]rpc.ModuleInfo{}
	}
	f.mods[c.Tenant] = append(f.mods[c.Tenant], info)
	return info, nil
}

func (f *fakeModules) List(_ context.Context, c rpc.Caller) ([]rpc.ModuleInfo, error) {
	if err := f.record(c); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.mods[c.Tenant]), nil
}

func (f *fakeModules) Delete(_ context.Context, c rpc.Caller, digest string) error {
	return f.record(c)
}

func (f *fakeModules) Deploy(_ context.Context, c rpc.Caller, d rpc.Deployment) ([]string, error) {
	if err := f.record(c); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deployed = append(f.deployed, d)
	return []string{d.Experts + ".0", d.Experts + ".1"}, nil
}

func (f *fakeModules) Undeploy(_ context.Context, c rpc.Caller, experts string) ([]string, error) {
	if err := f.record(c); err != nil {
		return nil, err
	}
	return []string{experts}, nil
}

func (f *fakeModules) lastCaller() rpc.Caller {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.callers) == 0 {
		return rpc.Caller{Tenant: "<none>"}
	}
	return f.callers[len(f.callers)-1]
}

// noExperts serves no experts, or the ones given.
type noExperts []rpc.Expert

func (n noExperts) Expert(uid string) (rpc.Expert, bool) {
	for _, e := range n {
		if e.Info().GetUid() == uid {
			return e, true
		}
	}
	return nil, false
}
func (n noExperts) All() []rpc.Expert { return n }

// server starts the handler on a real HTTP/1.1 + h2c server that closes
// with the test, and returns its URL.
func server(t *testing.T, experts rpc.Experts, opts rpc.Options) string {
	t.Helper()
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := httptest.NewUnstartedServer(rpc.NewHandler(experts, opts))
	srv.Config.Protocols = p
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// h2c is an HTTP client that speaks HTTP/2 without TLS.
func h2c() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

// withToken sets the Authorization header of unary and streaming calls.
type withToken string

func (w withToken) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if w != "" {
			req.Header().Set("Authorization", string(w))
		}
		return next(ctx, req)
	}
}

func (w withToken) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if w != "" {
			conn.RequestHeader().Set("Authorization", string(w))
		}
		return conn
	}
}

func (withToken) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func moduleClient(url, authorization string) moehostv1connect.ModuleServiceClient {
	return moehostv1connect.NewModuleServiceClient(h2c(), url, connect.WithInterceptors(withToken(authorization)))
}

// upload streams data in chunks of chunk bytes, the first message with
// name and, when size >= 0, size_bytes, and returns the response and the
// bytes the client managed to send.
func upload(ctx context.Context, c moehostv1connect.ModuleServiceClient, name string, size int64, data io.Reader, chunk int) (*moehostv1.ModuleInfo, int64, error) {
	stream := c.UploadModule(ctx)
	first := &moehostv1.UploadModuleRequest{Name: name}
	if size >= 0 {
		first.SizeBytes = &size
	}
	buf := make([]byte, chunk)
	var sent int64
	msg := first
	for {
		n, rerr := io.ReadFull(data, buf)
		if n > 0 {
			msg.Chunk = buf[:n]
		}
		if n > 0 || msg == first {
			if err := stream.Send(msg); err != nil {
				break // the server ended the call: CloseAndReceive says why
			}
			sent += int64(n)
		}
		msg = &moehostv1.UploadModuleRequest{}
		if rerr != nil {
			break
		}
	}
	res, err := stream.CloseAndReceive()
	if err != nil {
		return nil, sent, err
	}
	return res.Msg.GetModule(), sent, nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// TestUploadModule streams uploads through a real connect-go client and
// checks the digest, the cap, and the stream's own rules.
func TestUploadModule(t *testing.T) {
	t.Parallel()
	const capBytes = 4 << 20
	module := bytes.Repeat([]byte("\x00asm\x01\x00\x00\x00"), (3<<20+12345)/8)
	cases := []struct {
		name     string
		cap      int64
		size     int64 // declared; -1 none
		data     io.Reader
		chunk    int
		code     connect.Code // 0: success
		msg      string       // in the error
		maxRead  int64        // the most bytes Modules may have read
		maxSent  int64        // the most bytes the client may have sent; 0: any
		wantSize int64        // ModuleUpload.Size seen
	}{
		{name: "ok", cap: capBytes, size: -1, data: bytes.NewReader(module), chunk: 1 << 20, wantSize: -1},
		{name: "ok declared", cap: capBytes, size: int64(len(module)), data: bytes.NewReader(module), chunk: 64 << 10, wantSize: int64(len(module))},
		{name: "100 MB streamed past the cap", cap: capBytes, size: -1, data: io.LimitReader(zeros{}, 100<<20), chunk: 1 << 20,
			code: connect.CodeResourceExhausted, msg: "upload cap of 4 MiB", maxRead: capBytes, maxSent: 40 << 20},
		{name: "100 MB declared, default cap", cap: 0, size: 100 << 20, data: io.LimitReader(zeros{}, 100<<20), chunk: 1 << 20,
			code: connect.CodeResourceExhausted, msg: "upload cap of 64 MiB", maxRead: 0, maxSent: 40 << 20},
		{name: "shorter than declared", cap: capBytes, size: int64(len(module)) + 1, data: bytes.NewReader(module), chunk: 1 << 20,
			code: connect.CodeInvalidArgument, msg: "declared", maxRead: int64(len(module))},
		{name: "longer than declared", cap: capBytes, size: 100, data: bytes.NewReader(module), chunk: 1 << 20,
			code: connect.CodeInvalidArgument, msg: "longer than its declared", maxRead: 0},
		{name: "chunk over 1 MiB", cap: capBytes, size: -1, data: bytes.NewReader(module), chunk: 2 << 20,
			code: connect.CodeResourceExhausted, maxRead: 0},
		{name: "empty", cap: capBytes, size: -1, data: bytes.NewReader(nil), chunk: 1 << 20, wantSize: -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fake := &fakeModules{}
			url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake, MaxUploadBytes: tc.cap})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var whole bytes.Buffer
			info, sent, err := upload(ctx, moduleClient(url, "Bearer "+aliceToken), "ffn.wasm", tc.size, io.TeeReader(tc.data, &whole), tc.chunk)
			if tc.code == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if info.GetDigest() != digestOf(whole.Bytes()) || info.GetSizeBytes() != int64(whole.Len()) || info.GetName() != "ffn.wasm" {
					t.Errorf("got %s, %d bytes, %q; want %s, %d bytes, ffn.wasm", info.GetDigest(), info.GetSizeBytes(), info.GetName(), digestOf(whole.Bytes()), whole.Len())
				}
				if info.GetCreateTime().AsTime() != time.Unix(1700000000, 0).UTC() {
					t.Errorf("create_time %v", info.GetCreateTime().AsTime())
				}
				if got := fake.uploads[0]; got.Size != tc.wantSize || got.Name != "ffn.wasm" {
					t.Errorf("Modules saw %+v, want size %d", got, tc.wantSize)
				}
				if c := fake.lastCaller(); c != (rpc.Caller{Tenant: "alice"}) {
					t.Errorf("Modules saw caller %+v", c)
				}
				return
			}
			if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v with %q", err, tc.code, tc.msg)
			}
			if strings.Contains(err.Error(), tc.code.String()+": "+tc.code.String()) {
				t.Errorf("the code is repeated in the message: %v", err)
			}
			fake.mu.Lock()
			read := fake.read
			fake.mu.Unlock()
			if read > tc.maxRead {
				t.Errorf("Modules read %d bytes, want at most %d", read, tc.maxRead)
			}
			if tc.maxSent > 0 && sent > tc.maxSent {
				t.Errorf("the client sent %d bytes before the server stopped it, want at most %d", sent, tc.maxSent)
			}
		})
	}
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestUploadModuleStreamRules checks what only the first message may carry.
func TestUploadModuleStreamRules(t *testing.T) {
	t.Parallel()
	fake := &fakeModules{}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake})
	ctx := context.Background()
	c := moduleClient(url, "Bearer "+aliceToken)
	for _, second := range []*moehostv1.UploadModuleRequest{
		{Name: "again", Chunk: []byte("x")},
		{SizeBytes: new(int64(1)), Chunk: []byte("x")},
	} {
		stream := c.UploadModule(ctx)
		_ = stream.Send(&moehostv1.UploadModuleRequest{Name: "a", Chunk: []byte("\x00asm")})
		_ = stream.Send(second)
		_, err := stream.CloseAndReceive()
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "only the upload's first message") {
			t.Errorf("second message %v: got %v", second, err)
		}
	}
	for _, name := range []string{strings.Repeat("n", 257), "bad\nname", "bell\a"} {
		_, _, err := upload(ctx, c, name, -1, strings.NewReader("x"), 1)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "module name") {
			t.Errorf("name %q: got %v", name, err)
		}
	}
}

// TestModuleServiceCodes checks that each sentinel of the Codes table a
// server is given reaches the client as its code, from unary and
// client-streaming handlers alike, with the implementation's message and
// nothing else: the code is not repeated in it. An error the table does
// not list is Internal.
func TestModuleServiceCodes(t *testing.T) {
	t.Parallel()
	errGone := errors.New("module gone")
	errFull := errors.New("shelf full")
	codes := rpc.Codes{
		{Err: errGone, Code: connect.CodeNotFound},
		{Err: errFull, Code: connect.CodeResourceExhausted},
		{Err: context.DeadlineExceeded, Code: connect.CodeDeadlineExceeded},
	}
	cases := []struct {
		sentinel error
		code     connect.Code
	}{
		{errGone, connect.CodeNotFound},
		{errFull, connect.CodeResourceExhausted},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{errors.New("disk on fire"), connect.CodeInternal},
	}
	digest := digestOf([]byte("m"))
	for _, tc := range cases {
		t.Run(tc.code.String()+"/"+tc.sentinel.Error(), func(t *testing.T) {
			t.Parallel()
			fake := &fakeModules{err: fmt.Errorf("%w: module %s of tenant alice", tc.sentinel, digest)}
			url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake, Codes: codes})
			c := moduleClient(url, "Bearer "+aliceToken)
			ctx := context.Background()
			_, unary := c.DeleteModule(ctx, connect.NewRequest(&moehostv1.DeleteModuleRequest{Digest: digest}))
			_, _, streaming := upload(ctx, c, "m", -1, strings.NewReader("module"), 3)
			for what, err := range map[string]error{"unary": unary, "streaming": streaming} {
				if connect.CodeOf(err) != tc.code {
					t.Errorf("%s: got %v, want code %v", what, err, tc.code)
				}
				if !strings.Contains(err.Error(), "tenant alice") {
					t.Errorf("%s: the message lost its context: %v", what, err)
				}
				var ce *connect.Error
				if errors.As(err, &ce) && strings.HasPrefix(ce.Message(), strings.ReplaceAll(tc.code.String(), "_", " ")) {
					t.Errorf("%s: the message repeats the code: %q", what, ce.Message())
				}
			}
		})
	}
}

// TestModuleServiceAuth checks tokens on unary and streaming procedures,
// through connect-go and grpc-go clients.
func TestModuleServiceAuth(t *testing.T) {
	t.Parallel()
	fake := &fakeModules{}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake})
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cases := []struct {
		name, authorization string
		want                connect.Code // 0: served
		caller              rpc.Caller
	}{
		{name: "missing", want: connect.CodeUnauthenticated},
		{name: "unknown token", authorization: "Bearer nope", want: connect.CodeUnauthenticated},
		{name: "empty token", authorization: "Bearer ", want: connect.CodeUnauthenticated},
		{name: "other scheme", authorization: "Basic " + aliceToken, want: connect.CodeUnauthenticated},
		{name: "bare token", authorization: aliceToken, want: connect.CodeUnauthenticated},
		{name: "alice", authorization: "Bearer " + aliceToken, caller: rpc.Caller{Tenant: "alice"}},
		{name: "lower-case scheme", authorization: "bearer " + bobToken, caller: rpc.Caller{Tenant: "bob"}},
		{name: "operator", authorization: "Bearer " + operatorToken, caller: rpc.Caller{Operator: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := moduleClient(url, tc.authorization)
			_, unary := c.ListModules(ctx, connect.NewRequest(&moehostv1.ListModulesRequest{}))
			_, _, streaming := upload(ctx, c, "m", -1, strings.NewReader("module"), 4)
			gctx := ctx
			if tc.authorization != "" {
				gctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.authorization)
			}
			gUnary := conn.Invoke(gctx, moehostv1connect.ModuleServiceListModulesProcedure, &moehostv1.ListModulesRequest{}, &moehostv1.ListModulesResponse{})
			gStreaming := grpcUpload(gctx, conn, []byte("module"))
			for what, err := range map[string]error{"connect unary": unary, "connect streaming": streaming} {
				if connect.CodeOf(err) != tc.want && !(tc.want == 0 && err == nil) {
					t.Errorf("%s: got %v, want %v", what, err, tc.want)
				}
			}
			for what, err := range map[string]error{"grpc unary": gUnary, "grpc streaming": gStreaming} {
				if status.Code(err) != codes.Code(tc.want) {
					t.Errorf("%s: got %v, want %v", what, err, tc.want)
				}
			}
			if tc.want == 0 && fake.lastCaller() != tc.caller {
				t.Errorf("Modules saw %+v, want %+v", fake.lastCaller(), tc.caller)
			}
		})
	}
}

// grpcUpload uploads data in two chunks through grpc-go.
func grpcUpload(ctx context.Context, conn *grpc.ClientConn, data []byte) error {
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, moehostv1connect.ModuleServiceUploadModuleProcedure)
	if err != nil {
		return err
	}
	half := len(data) / 2
	if err := stream.SendMsg(&moehostv1.UploadModuleRequest{Name: "g", Chunk: data[:half]}); err != nil && err != io.EOF {
		return err
	}
	if err := stream.SendMsg(&moehostv1.UploadModuleRequest{Chunk: data[half:]}); err != nil && err != io.EOF {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	var res moehostv1.UploadModuleResponse
	if err := stream.RecvMsg(&res); err != nil {
		return err
	}
	if res.GetModule().GetDigest() != digestOf(data) {
		return fmt.Errorf("digest %s, want %s", res.GetModule().GetDigest(), digestOf(data))
	}
	return nil
}

// TestUploadModuleGRPCCap uploads past the cap through grpc-go.
func TestUploadModuleGRPCCap(t *testing.T) {
	t.Parallel()
	// The store calls the failed read invalid; the cap still decides.
	errBadModule := errors.New("bad module")
	fake := &fakeModules{readErr: errBadModule}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake, MaxUploadBytes: 1 << 20,
		Codes: rpc.Codes{{Err: errBadModule, Code: connect.CodeInvalidArgument}}})
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+aliceToken)
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, moehostv1connect.ModuleServiceUploadModuleProcedure)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 512<<10)
	for i := 0; i < 200; i++ { // 100 MiB, unless the server stops us
		if err := stream.SendMsg(&moehostv1.UploadModuleRequest{Chunk: chunk}); err != nil {
			break
		}
	}
	_ = stream.CloseSend()
	err = stream.RecvMsg(&moehostv1.UploadModuleResponse{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "upload cap of 1 MiB") {
		t.Fatalf("got %v, want ResourceExhausted naming the cap", err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.read > 1<<20 {
		t.Errorf("Modules read %d bytes past the cap", fake.read)
	}
}

// TestDeployExpert sends a full deployment and checks what Modules got.
func TestDeployExpert(t *testing.T) {
	t.Parallel()
	fake := &fakeModules{}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake})
	c := moduleClient(url, "Bearer "+aliceToken)
	digest := digestOf([]byte("m"))
	res, err := c.DeployExpert(context.Background(), connect.NewRequest(&moehostv1.DeployExpertRequest{
		Experts: "alice.ffn.[0:2]", ModuleDigest: digest, Config: map[string]int64{"hidden_dim": 64},
		Optimizer:      &moehostv1.OptimizerConfig{Name: "adamw", Lr: 1e-4, Momentum: 0.5, WeightDecay: 0.1, ClipGradNorm: 1, Scheduler: "linear", NumWarmupSteps: 10, NumTrainingSteps: 100},
		Batching:       &moehostv1.BatchLimits{MaxBatchSize: 64, MinBatchSize: 2, MaxWait: durationpb.New(5 * time.Millisecond), QueueSize: 16},
		Limits:         &moehostv1.ExpertLimits{CallTimeout: durationpb.New(3 * time.Second), BytesPerCall: 1 << 20, ParamBytes: 2 << 20, MemoryPages: 32},
		BackwardAccess: moehostv1.Access_ACCESS_TENANTS,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Msg.GetUids(); !slices.Equal(got, []string{"alice.ffn.[0:2].0", "alice.ffn.[0:2].1"}) {
		t.Errorf("uids %v", got)
	}
	want := rpc.Deployment{
		Experts: "alice.ffn.[0:2]", Module: digest, Config: map[string]int64{"hidden_dim": 64},
		Batching: rpc.BatchLimits{MaxBatchSize: 64, MinBatchSize: 2, MaxWait: 5 * time.Millisecond, QueueSize: 16},
		Limits:   rpc.ExpertLimits{CallTimeout: 3 * time.Second, BytesPerCall: 1 << 20, ParamBytes: 2 << 20, MemoryPages: 32},
		Forward:  rpc.AccessPublic, Backward: rpc.AccessTenants,
	}
	wantOpt := &moehostv1.OptimizerConfig{Name: "adamw", Lr: 1e-4, Momentum: 0.5, WeightDecay: 0.1, ClipGradNorm: 1, Scheduler: "linear", NumWarmupSteps: 10, NumTrainingSteps: 100}
	got := fake.deployed[0]
	if !proto.Equal(got.Optimizer, wantOpt) {
		t.Errorf("Modules got optimizer %v, want %v", got.Optimizer, wantOpt)
	}
	got.Optimizer = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Modules got\n%+v\nwant\n%+v", got, want)
	}
	un, err := c.UndeployExpert(context.Background(), connect.NewRequest(&moehostv1.UndeployExpertRequest{Experts: "alice.ffn.0"}))
	if err != nil || !slices.Equal(un.Msg.GetUids(), []string{"alice.ffn.0"}) {
		t.Errorf("undeploy: %v, %v", un, err)
	}
	_, err = c.UndeployExpert(context.Background(), connect.NewRequest(&moehostv1.UndeployExpertRequest{}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("undeploy of nothing: %v", err)
	}
	_, err = c.DeleteModule(context.Background(), connect.NewRequest(&moehostv1.DeleteModuleRequest{Digest: "sha256:XYZ"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("delete of a bad digest: %v", err)
	}
}

// TestDeploymentFromProto checks the defaults and each wire-level refusal.
func TestDeploymentFromProto(t *testing.T) {
	t.Parallel()
	digest := digestOf([]byte("m"))
	valid := func() *moehostv1.DeployExpertRequest {
		return &moehostv1.DeployExpertRequest{Experts: "a.[0:4]", ModuleDigest: digest}
	}
	d, err := rpc.DeploymentFromProto(valid())
	if err != nil {
		t.Fatal(err)
	}
	if d.Forward != rpc.AccessPublic || d.Backward != rpc.AccessOwner || d.Optimizer != nil || d.Config == nil || d.Batching != (rpc.BatchLimits{}) || d.Limits != (rpc.ExpertLimits{}) {
		t.Errorf("defaults: %+v", d)
	}
	cases := []struct {
		name   string
		modify func(r *moehostv1.DeployExpertRequest)
		msg    string
	}{
		{"no experts", func(r *moehostv1.DeployExpertRequest) { r.Experts = "" }, "experts"},
		{"long experts", func(r *moehostv1.DeployExpertRequest) { r.Experts = strings.Repeat("a", 1025) }, "longer"},
		{"no digest", func(r *moehostv1.DeployExpertRequest) { r.ModuleDigest = "" }, "digest"},
		{"upper-case digest", func(r *moehostv1.DeployExpertRequest) { r.ModuleDigest = strings.ToUpper(digest) }, "digest"},
		{"short digest", func(r *moehostv1.DeployExpertRequest) { r.ModuleDigest = digest[:70] }, "digest"},
		{"empty config key", func(r *moehostv1.DeployExpertRequest) { r.Config = map[string]int64{"": 1} }, "config key"},
		{"negative lr", func(r *moehostv1.DeployExpertRequest) { r.Optimizer = &moehostv1.OptimizerConfig{Lr: -1} }, "lr"},
		{"NaN clip", func(r *moehostv1.DeployExpertRequest) {
			r.Optimizer = &moehostv1.OptimizerConfig{ClipGradNorm: nan()}
		}, "clip_grad_norm"},
		{"negative steps", func(r *moehostv1.DeployExpertRequest) { r.Optimizer = &moehostv1.OptimizerConfig{NumTrainingSteps: -1} }, "steps"},
		{"negative batch", func(r *moehostv1.DeployExpertRequest) { r.Batching = &moehostv1.BatchLimits{QueueSize: -1} }, "batching"},
		{"negative wait", func(r *moehostv1.DeployExpertRequest) {
			r.Batching = &moehostv1.BatchLimits{MaxWait: durationpb.New(-time.Second)}
		}, "max_wait"},
		{"invalid timeout", func(r *moehostv1.DeployExpertRequest) {
			r.Limits = &moehostv1.ExpertLimits{CallTimeout: &durationpb.Duration{Seconds: 1, Nanos: -1}}
		}, "call_timeout"},
		{"negative bytes", func(r *moehostv1.DeployExpertRequest) { r.Limits = &moehostv1.ExpertLimits{ParamBytes: -1} }, "limits"},
		{"unknown access", func(r *moehostv1.DeployExpertRequest) { r.BackwardAccess = 9 }, "backward_access"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := valid()
			tc.modify(r)
			_, err := rpc.DeploymentFromProto(r)
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("got %v, want invalid argument about %q", err, tc.msg)
			}
		})
	}
}

func nan() float64 { z := 0.0; return z / z }

// TestModuleServiceReflection checks that reflection lists ModuleService
// exactly when it is served, and that it is not served without Modules.
func TestModuleServiceReflection(t *testing.T) {
	t.Parallel()
	for _, served := range []bool{true, false} {
		opts := rpc.Options{Auth: fakeAuth{}}
		if served {
			opts.Modules = &fakeModules{}
		}
		url := server(t, noExperts{}, opts)
		addr := strings.TrimPrefix(url, "http://")
		if names := grpcreflect.Services(t, addr); slices.Contains(names, moehostv1connect.ModuleServiceName) != served {
			t.Errorf("served %v: reflection lists %v", served, names)
		}
		// The descriptor comes with its comments, for grpcurl describe.
		if served {
			files := grpcreflect.FileContainingSymbol(t, addr, moehostv1connect.ModuleServiceName)
			if len(files) == 0 {
				t.Fatal("reflection has no file of ModuleService")
			}
			if !bytes.Contains(files[0], []byte("ACCESS_OWNER lets only")) {
				t.Error("the served descriptor has no comments")
			}
		}
		_, err := moduleClient(url, "Bearer "+aliceToken).ListModules(context.Background(), connect.NewRequest(&moehostv1.ListModulesRequest{}))
		if served != (err == nil) || !served && connect.CodeOf(err) != connect.CodeUnimplemented {
			t.Errorf("served %v: ListModules: %v", served, err)
		}
	}
}

// guarded is an expert with no inputs or outputs and an access rule.
type guarded struct {
	uid, owner        string
	forward, backward rpc.Access
	calls             *int
}

func (g guarded) Info() *moehostv1.ExpertInfo { return &moehostv1.ExpertInfo{Uid: g.uid} }
func (g guarded) Schema() (in, out []*moehostv1.TensorSchema) {
	return nil, nil
}
func (g guarded) ForwardWire(context.Context, []wire.Raw, abi.DType) ([]wire.Raw, error) {
	*g.calls++
	return nil, nil
}
func (g guarded) BackwardWire(context.Context, []wire.Raw, []wire.Raw, abi.DType) ([]wire.Raw, error) {
	*g.calls++
	return nil, nil
}
func (g guarded) Access() (string, rpc.Access, rpc.Access) { return g.owner, g.forward, g.backward }

// TestExpertAccess checks ExpertService's optional tokens and the
// per-expert access rules of Guarded experts, before any compute.
func TestExpertAccess(t *testing.T) {
	t.Parallel()
	calls := 0
	experts := noExperts{
		guarded{uid: "alice.pub", owner: "alice", forward: rpc.AccessPublic, backward: rpc.AccessOwner, calls: &calls},
		guarded{uid: "alice.tenants", owner: "alice", forward: rpc.AccessTenants, backward: rpc.AccessTenants, calls: &calls},
		guarded{uid: "op.owner", owner: "", forward: rpc.AccessOwner, backward: rpc.AccessOwner, calls: &calls},
	}
	url := server(t, experts, rpc.Options{Auth: fakeAuth{}})
	type call struct {
		uid      string
		backward bool
		token    string
		want     connect.Code
	}
	cases := []call{
		{"alice.pub", false, "", 0},
		{"alice.pub", false, bobToken, 0},
		{"alice.pub", false, "nope", connect.CodeUnauthenticated},
		{"alice.pub", true, "", connect.CodeUnauthenticated},
		{"alice.pub", true, bobToken, connect.CodePermissionDenied},
		{"alice.pub", true, aliceToken, 0},
		{"alice.pub", true, operatorToken, 0},
		{"alice.tenants", false, "", connect.CodeUnauthenticated},
		{"alice.tenants", false, bobToken, 0},
		{"alice.tenants", true, bobToken, 0},
		{"op.owner", false, aliceToken, connect.CodePermissionDenied},
		{"op.owner", true, "", connect.CodeUnauthenticated},
		{"op.owner", false, operatorToken, 0},
	}
	for _, tc := range cases {
		auth := ""
		if tc.token != "" {
			auth = "Bearer " + tc.token
		}
		c := moehostv1connect.NewExpertServiceClient(h2c(), url, connect.WithInterceptors(withToken(auth)))
		before := calls
		var err error
		if tc.backward {
			_, err = c.Backward(context.Background(), connect.NewRequest(&moehostv1.BackwardRequest{Uid: tc.uid}))
		} else {
			_, err = c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: tc.uid}))
		}
		if connect.CodeOf(err) != tc.want && !(tc.want == 0 && err == nil) {
			t.Errorf("%+v: got %v", tc, err)
		}
		if ran := calls > before; ran != (tc.want == 0) {
			t.Errorf("%+v: the expert ran: %v", tc, ran)
		}
	}
	// Listing needs no token, but refuses a bad one.
	c := moehostv1connect.NewExpertServiceClient(h2c(), url)
	if _, err := c.ListExperts(context.Background(), connect.NewRequest(&moehostv1.ListExpertsRequest{})); err != nil {
		t.Errorf("anonymous ListExperts: %v", err)
	}
	c = moehostv1connect.NewExpertServiceClient(h2c(), url, connect.WithInterceptors(withToken("Bearer nope")))
	if _, err := c.ListExperts(context.Background(), connect.NewRequest(&moehostv1.ListExpertsRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("ListExperts with a bad token: %v", err)
	}
}

// TestAccessCheck is Caller.Check's table: who gets in, and what each
// refusal names as the way in.
func TestAccessCheck(t *testing.T) {
	t.Parallel()
	anon, alice, bob, op := rpc.Caller{}, rpc.Caller{Tenant: "alice"}, rpc.Caller{Tenant: "bob"}, rpc.Caller{Operator: true}
	const operator = "--admin-token; --public-backward opens their Backward to all"
	cases := []struct {
		a     rpc.Access
		c     rpc.Caller
		owner string
		want  connect.Code // 0: allowed
		msg   string       // in the refusal
	}{
		{rpc.AccessPublic, anon, "alice", 0, ""},
		{rpc.AccessTenants, anon, "alice", connect.CodeUnauthenticated, " needs a token (Authorization: Bearer <token>): any tenant's"},
		{rpc.AccessTenants, bob, "alice", 0, ""},
		{rpc.AccessOwner, anon, "alice", connect.CodeUnauthenticated, " needs a token (Authorization: Bearer <token>): its owner's"},
		{rpc.AccessOwner, bob, "alice", connect.CodePermissionDenied, " is open to its owner only: send its owner's token"},
		{rpc.AccessOwner, alice, "alice", 0, ""},
		{rpc.AccessOwner, op, "alice", 0, ""},
		{rpc.AccessOwner, anon, "", connect.CodeUnauthenticated, " needs a token (Authorization: Bearer <token>): the operator's experts take the server's " + operator},
		{rpc.AccessOwner, alice, "", connect.CodePermissionDenied, " is open to its owner only: the operator's experts take the server's " + operator},
		{rpc.AccessOwner, op, "", 0, ""},
		{rpc.Access(0), alice, "alice", connect.CodeInternal, ": BUG: access"},
	}
	for _, tc := range cases {
		err := tc.c.Check(tc.a, tc.owner, "forward \"x\"")
		if tc.want == 0 && err != nil || tc.want != 0 && connect.CodeOf(err) != tc.want {
			t.Errorf("%v for %+v on %q's: got %v, want %v", tc.a, tc.c, tc.owner, err, tc.want)
			continue
		}
		if tc.want != 0 && !strings.Contains(err.Error(), `forward "x"`+tc.msg) {
			t.Errorf("%v for %+v on %q's: %q, want it to say %q", tc.a, tc.c, tc.owner, err, tc.msg)
		}
	}
}

// FuzzDeploymentFromProto feeds arbitrary DeployExpertRequest bytes to the
// converter: it never panics, and what it accepts is sane.
func FuzzDeploymentFromProto(f *testing.F) {
	seed, _ := proto.Marshal(&moehostv1.DeployExpertRequest{
		Experts: "a.[0:4]", ModuleDigest: digestOf([]byte("m")), Config: map[string]int64{"hidden_dim": 8},
		Optimizer: &moehostv1.OptimizerConfig{Lr: 1}, Batching: &moehostv1.BatchLimits{MaxWait: durationpb.New(time.Millisecond)},
		Limits: &moehostv1.ExpertLimits{CallTimeout: durationpb.New(time.Second)}, ForwardAccess: moehostv1.Access_ACCESS_TENANTS,
	})
	f.Add(seed)
	// Refused ones too, so that mutations start next to the edges.
	d := func(b *moehostv1.BatchLimits, l *moehostv1.ExpertLimits, o *moehostv1.OptimizerConfig) *moehostv1.DeployExpertRequest {
		return &moehostv1.DeployExpertRequest{Experts: "a", ModuleDigest: digestOf(nil), Batching: b, Limits: l, Optimizer: o}
	}
	for _, r := range []*moehostv1.DeployExpertRequest{
		d(&moehostv1.BatchLimits{QueueSize: -1}, nil, nil),
		d(&moehostv1.BatchLimits{MaxBatchSize: -1}, nil, nil),
		d(&moehostv1.BatchLimits{MinBatchSize: -1}, nil, nil),
		d(&moehostv1.BatchLimits{MaxWait: durationpb.New(-time.Second)}, nil, nil),
		d(nil, &moehostv1.ExpertLimits{ParamBytes: -1}, nil),
		d(nil, &moehostv1.ExpertLimits{BytesPerCall: -1}, nil),
		d(nil, &moehostv1.ExpertLimits{CallTimeout: durationpb.New(-time.Second)}, nil),
		d(nil, nil, &moehostv1.OptimizerConfig{Lr: -1}),
		d(nil, nil, &moehostv1.OptimizerConfig{NumTrainingSteps: -1}),
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req moehostv1.DeployExpertRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		d, err := rpc.DeploymentFromProto(&req)
		if err != nil {
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("error that is not InvalidArgument: %v", err)
			}
			return
		}
		if rpc.CheckDigest(d.Module) != nil || d.Experts == "" || d.Config == nil ||
			d.Forward < rpc.AccessPublic || d.Forward > rpc.AccessTenants || d.Backward < rpc.AccessPublic || d.Backward > rpc.AccessTenants ||
			d.Batching.MaxBatchSize < 0 || d.Batching.MinBatchSize < 0 || d.Batching.QueueSize < 0 || d.Batching.MaxWait < 0 ||
			d.Limits.CallTimeout < 0 || d.Limits.BytesPerCall < 0 || d.Limits.ParamBytes < 0 {
			t.Fatalf("accepted %+v", d)
		}
		if o := d.Optimizer; o != nil && (!(o.GetLr() >= 0) || !(o.GetMomentum() >= 0) || !(o.GetWeightDecay() >= 0) || !(o.GetClipGradNorm() >= 0) || o.GetNumWarmupSteps() < 0 || o.GetNumTrainingSteps() < 0) {
			t.Fatalf("accepted optimizer %v", o)
		}
	})
}

// TestUploadModuleHammer runs concurrent uploads of different modules
// over one client: each gets its own digest, never another stream's bytes.
func TestUploadModuleHammer(t *testing.T) {
	t.Parallel()
	fake := &fakeModules{}
	url := server(t, noExperts{}, rpc.Options{Auth: fakeAuth{}, Modules: fake})
	c := moduleClient(url, "Bearer "+aliceToken)
	const uploads = 16
	var wg sync.WaitGroup
	errs := make(chan error, uploads)
	for i := range uploads {
		wg.Go(func() {
			data := bytes.Repeat([]byte{byte(i), byte(i >> 8), 7}, 100_000+i*1000)
			info, _, err := upload(context.Background(), c, fmt.Sprintf("m%d", i), int64(len(data)), bytes.NewReader(data), 64<<10)
			switch {
			case err != nil:
				errs <- fmt.Errorf("upload %d: %w", i, err)
			case info.GetDigest() != digestOf(data) || info.GetSizeBytes() != int64(len(data)):
				errs <- fmt.Errorf("upload %d: got %s (%d bytes), want %s (%d bytes)", i, info.GetDigest(), info.GetSizeBytes(), digestOf(data), len(data))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
