package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/internal/batching"
	"github.com/moehost/moehost/sdk/wire"
)

// Modules is the module registry and the live expert set as ModuleService
// sees them; package host implements it. Each method gets the
// authenticated caller (never anonymous) and decides what that caller may
// see and do. Its errors wrap the implementation's own sentinels, which
// the Codes table given to NewHandler maps to Connect codes (another
// tenant's module is PermissionDenied, a module still deployed
// FailedPrecondition, a tenant cap ResourceExhausted, and so on).
type Modules interface {
	// BeginUpload takes one of the caller's uploads in flight, or
	// refuses it (a *connect.Error or a coded error), as soon as an
	// UploadModule stream's headers are in, before its first message:
	// a stream that trickles counts from its start. end gives it back;
	// the handler calls it when the stream ends.
	BeginUpload(ctx context.Context, c Caller) (end func(), err error)
	// Upload stores the module read from u.Body and returns it. Body is
	// already capped at Options.MaxUploadBytes; Upload reads it to io.EOF
	// before it succeeds, and keeps no more of it in memory than it
	// must. Uploading the same bytes twice is not an error.
	Upload(ctx context.Context, c Caller, u ModuleUpload) (ModuleInfo, error)
	// List returns the caller's modules, sorted by digest.
	List(ctx context.Context, c Caller) ([]ModuleInfo, error)
	// Delete removes one of the caller's modules.
	Delete(ctx context.Context, c Caller, digest string) error
	// Deploy starts the experts d describes and returns their uids,
	// sorted.
	Deploy(ctx context.Context, c Caller, d Deployment) ([]string, error)
	// Undeploy stops the experts that experts (a uid or pattern) names
	// and returns their uids, sorted.
	Undeploy(ctx context.Context, c Caller, experts string) ([]string, error)
}

// ModuleUpload is one module upload as it streams in.
type ModuleUpload struct {
	// Name is the label the client gave, maybe "".
	Name string
	// Size is the length the client declared, already checked against
	// the cap, or -1 when it declared none. Body fails unless it yields
	// exactly Size bytes, so an implementation may charge Size against a
	// quota before it reads.
	Size int64
	// Body yields the module's bytes. Past the cap, or past Size, it
	// fails with a *connect.Error (ResourceExhausted or InvalidArgument),
	// which keeps its code through any wrapping.
	Body io.Reader
}

// ModuleInfo describes one stored module.
type ModuleInfo struct {
	// Digest is "sha256:" and 64 lower-case hex digits.
	Digest string
	// Size is the module's length in bytes.
	Size int64
	// Name is the label given at upload.
	Name string
	// Created is when the tenant first uploaded it; zero omits it.
	Created time.Time
	// Experts are the uids of the tenant's experts that run it, sorted.
	Experts []string
}

// Deployment is a DeployExpert request checked for wire-level sanity by
// sdk/wire's DeploymentFromProto (non-negative limits, a well-formed
// digest, known accesses, finite numbers): the implementation checks the
// rest (patterns, prefixes, caps, optimizer names).
type Deployment = wire.Deployment

// BatchLimits is internal/batching's, the one set of batch limits of the
// pools, the server and the wire.
type BatchLimits = batching.Limits

// ExpertLimits is sdk/wire's: they bound one expert's calls; zero fields
// take the tenant's caps.
type ExpertLimits = wire.ExpertLimits

// Limits of ModuleService's wire.
const (
	// DefaultMaxUploadBytes is Options.MaxUploadBytes' default.
	DefaultMaxUploadBytes = 64 << 20
	// maxChunkBytes is the most bytes one UploadModuleRequest's chunk may
	// carry; the proto says 1 MiB.
	maxChunkBytes = 1 << 20
	// maxModuleMessageBytes caps every ModuleService request message: a
	// full chunk and its framing, or a deploy request's config.
	maxModuleMessageBytes = maxChunkBytes + 64<<10
	// maxNameBytes caps a module's name, as it does a config key.
	maxNameBytes = wire.MaxNameBytes
)

// UploadLimits bound each module upload. Zero fields take the defaults.
type UploadLimits struct {
	// MaxBytes caps the module. Default DefaultMaxUploadBytes (64 MiB).
	MaxBytes int64
	// IdleTimeout cuts an upload whose client sends nothing for this
	// long. Default DefaultUploadIdleTimeout (10s).
	IdleTimeout time.Duration
	// Timeout cuts an upload that is not complete this long after it
	// began, however it trickles. Default DefaultUploadTimeout (2m).
	Timeout time.Duration
	// MinRate cuts an upload that has sent less than this many bytes a
	// second on average, MinRateGrace after it began. Default
	// DefaultMinBodyRate; negative: none.
	MinRate int64
}

// DefaultMinBodyRate is the slowest a request body or an upload may
// arrive on average, in bytes a second, once MinRateGrace is over: a
// client that sends a byte every second or two passes every idle
// deadline, and held a stream, a goroutine and a descriptor until the
// total one.
const DefaultMinBodyRate = 1 << 10

// MinRateGrace is how long a body may take before its rate counts: a
// small body is in long before, and a large one has had time to ramp.
const MinRateGrace = 5 * time.Second

func minRate(r int64) int64 {
	switch {
	case r == 0:
		return DefaultMinBodyRate
	case r < 0:
		return 0
	}
	return r
}

// The defaults of UploadLimits' timeouts.
const (
	DefaultUploadIdleTimeout = 10 * time.Second
	DefaultUploadTimeout     = 2 * time.Minute
)

func (u UploadLimits) withDefaults() UploadLimits {
	if u.MaxBytes <= 0 {
		u.MaxBytes = DefaultMaxUploadBytes
	}
	if u.IdleTimeout <= 0 {
		u.IdleTimeout = DefaultUploadIdleTimeout
	}
	if u.Timeout <= 0 {
		u.Timeout = DefaultUploadTimeout
	}
	return u
}

// NewModuleHandler returns ModuleService's path and handler: every call
// needs a token that auth accepts, uploads are bounded by limits, and
// errors are mapped to codes by codes. NewHandler mounts it when Options.Modules
// is set; a server that mounts it itself lists
// moehostv1connect.ModuleServiceName in reflection.
func NewModuleHandler(m Modules, auth Authenticator, limits UploadLimits, codes Codes) (string, http.Handler) {
	return newModuleHandler(m, auth, limits, codes, nil)
}

// newModuleHandler is NewModuleHandler with metrics, which count its
// calls.
func newModuleHandler(m Modules, auth Authenticator, limits UploadLimits, codes Codes, metrics *Metrics) (string, http.Handler) {
	if m == nil || auth == nil {
		panic("BUG: rpc.NewModuleHandler needs Modules and an Authenticator")
	}
	limits = limits.withDefaults()
	path, h := moehostv1connect.NewModuleServiceHandler(&moduleService{m: m, maxUpload: limits.MaxBytes},
		metrics.interceptors(codes.Interceptor(), gate(authGate{auth: auth, required: true, service: "ModuleService"}.caller)),
		readLimit(maxModuleMessageBytes),
		connect.WithCompressMinBytes(math.MaxInt),
	)
	return path, uploadDeadlines(h, limits.IdleTimeout, limits.Timeout, minRate(limits.MinRate), metrics)
}

// uploadDeadlines wraps h so that an UploadModule stream's body must keep
// coming: no read of it waits longer than idle, and none ends later than
// total after the stream began. The server's own timeouts cannot do this
// per stream: an HTTP/2 connection carries many, and a ReadTimeout on an
// HTTP/1 connection would also cut a long Forward after its body is in.
// Past MinRateGrace, it must also average rate bytes a second (0: no
// floor). m counts the streams cut.
func uploadDeadlines(h http.Handler, idle, total time.Duration, rate int64, m *Metrics) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != moehostv1connect.ModuleServiceUploadModuleProcedure {
			h.ServeHTTP(w, r)
			return
		}
		b := newDeadlineBody(r.Body, w, "the upload", idle, total, rate, m)
		r = r.WithContext(context.WithValue(r.Context(), deadlineKey{}, b))
		r.Body = b
		h.ServeHTTP(w, r)
	})
}

type deadlineKey struct{}

// deadlineBody is a request body that sets the stream's read deadline
// before each read, and remembers which deadline cut it.
type deadlineBody struct {
	io.ReadCloser
	rc *http.ResponseController
	// what names the body in the cut's message ("the upload").
	what        string
	idle, total time.Duration
	start, end  time.Time
	// rate is the least average bytes a second past MinRateGrace (0:
	// none), and n the bytes read so far.
	rate, n int64
	// coded makes Read return the cut's *connect.Error itself, for
	// unary calls, whose body connect reads before any code of ours
	// runs; connect passes a *connect.Error from the body on as it is.
	coded bool

	// metrics count the cut, once (nil: not).
	metrics *Metrics

	mu  sync.Mutex
	cut error // set once a deadline cut the body
}

// newDeadlineBody bounds body, w's request's, from now on.
func newDeadlineBody(body io.ReadCloser, w http.ResponseWriter, what string, idle, total time.Duration, rate int64, m *Metrics) *deadlineBody {
	now := time.Now()
	return &deadlineBody{ReadCloser: body, rc: http.NewResponseController(w), what: what, idle: idle, total: total,
		start: now, end: now.Add(total), rate: rate, metrics: m}
}

// slowAt is when the body's average rate, with what it sent so far,
// falls below b.rate (never before MinRateGrace is over); zero without a
// floor.
func (b *deadlineBody) slowAt() time.Time {
	if b.rate <= 0 {
		return time.Time{}
	}
	at := b.start.Add(time.Duration(float64(b.n) / float64(b.rate) * float64(time.Second)))
	return later(at, b.start.Add(MinRateGrace))
}

// deadline is the next read's: the earliest of the idle, the total and
// the rate deadlines.
func (b *deadlineBody) deadline(now time.Time) time.Time {
	d := now.Add(b.idle)
	if d.After(b.end) {
		d = b.end
	}
	if slow := b.slowAt(); !slow.IsZero() && slow.Before(d) {
		d = slow
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	// A writer that cannot set deadlines (a test's recorder) reads
	// without one.
	_ = b.rc.SetReadDeadline(b.deadline(time.Now()))
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if err != nil {
		// The body has ended, so its deadlines have too. Left set, the
		// idle deadline fires on HTTP/1.1 during the compile that follows:
		// the server's background read of the connection hits it and
		// cancels the call.
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		b.mu.Lock()
		first := b.cut == nil
		now := time.Now()
		reason := refusedBodyIdle
		switch slow := b.slowAt(); {
		case !now.Before(b.end):
			reason = refusedBodyTimeout
			b.cut = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s took longer than %v; it was cut", b.what, b.total))
		case !slow.IsZero() && !now.Before(slow):
			reason = refusedBodySlow
			took := now.Sub(b.start).Round(time.Millisecond)
			b.cut = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s sent %d bytes in %v, below the least average rate of %d bytes/s; it was cut", b.what, b.n, took, b.rate))
		default:
			b.cut = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s sent nothing for %v; it was cut", b.what, b.idle))
		}
		if first {
			b.metrics.refuse(reason)
		}
		if b.coded {
			err = b.cut
		}
		b.mu.Unlock()
	}
	return n, err
}

// deadlineErr returns the error that says which deadline cut ctx's
// upload, or nil if none did.
func deadlineErr(ctx context.Context) error {
	b, _ := ctx.Value(deadlineKey{}).(*deadlineBody)
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cut
}

type moduleService struct {
	m         Modules
	maxUpload int64
}

// caller returns the authenticated caller; the interceptor refuses
// anonymous ones, so one here is a wiring bug.
func caller(ctx context.Context) (Caller, error) {
	c := CallerFrom(ctx)
	if c.Anonymous() {
		return c, errorf(connect.CodeUnauthenticated, "ModuleService needs a tenant's or the operator's token")
	}
	return c, nil
}

func (s *moduleService) UploadModule(ctx context.Context, stream *connect.ClientStream[moehostv1.UploadModuleRequest]) (*connect.Response[moehostv1.UploadModuleResponse], error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	end, err := s.m.BeginUpload(ctx, c)
	if err != nil {
		return nil, err
	}
	defer end()
	if !stream.Receive() {
		if err := deadlineErr(ctx); err != nil {
			return nil, err
		}
		if err := stream.Err(); err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		return nil, errorf(connect.CodeInvalidArgument, "the upload stream is empty")
	}
	first := stream.Msg()
	if err := checkName(first.GetName()); err != nil {
		return nil, err
	}
	size := int64(-1)
	if first.SizeBytes != nil {
		size = first.GetSizeBytes()
		switch {
		case size <= 0:
			return nil, errorf(connect.CodeInvalidArgument, "size_bytes %d is not positive", size)
		case size > s.maxUpload:
			return nil, errorf(connect.CodeResourceExhausted, "the module's %d bytes exceed this server's upload cap of %s", size, byteSize(s.maxUpload))
		}
	}
	body := &uploadBody{ctx: ctx, stream: stream, chunk: first.GetChunk(), max: s.maxUpload, declared: size}
	if err := body.checkChunk(); err != nil {
		return nil, err
	}
	info, err := s.m.Upload(ctx, c, ModuleUpload{Name: first.GetName(), Size: size, Body: body})
	if body.err != nil && !errors.Is(body.err, io.EOF) {
		// The stream's own failure (the cap, a bad message, a lost
		// client) explains whatever the implementation made of it.
		return nil, body.err
	}
	if err != nil {
		return nil, fmt.Errorf("upload: %w", err)
	}
	if body.err == nil {
		return nil, errorf(connect.CodeInternal, "BUG: the module store returned before the upload's end")
	}
	return connect.NewResponse(&moehostv1.UploadModuleResponse{Module: info.proto()}), nil
}

// uploadBody reads an upload stream's chunks as one byte stream, one
// message at a time, failing past the cap or the declared size.
type uploadBody struct {
	ctx      context.Context // for deadlineErr
	stream   *connect.ClientStream[moehostv1.UploadModuleRequest]
	chunk    []byte // the unread rest of the current message's chunk
	n        int64  // bytes received so far, chunk included
	max      int64
	declared int64 // -1: none
	err      error // sticky; io.EOF at the clean end
}

// checkChunk counts the chunk just received against the limits.
func (b *uploadBody) checkChunk() error {
	if len(b.chunk) > maxChunkBytes {
		b.err = errorf(connect.CodeInvalidArgument, "an upload chunk of %d bytes is larger than %d bytes", len(b.chunk), maxChunkBytes)
		return b.err
	}
	b.n += int64(len(b.chunk))
	switch {
	case b.n > b.max:
		b.err = errorf(connect.CodeResourceExhausted, "the module exceeds this server's upload cap of %s", byteSize(b.max))
	case b.declared >= 0 && b.n > b.declared:
		b.err = errorf(connect.CodeInvalidArgument, "the upload is longer than its declared size_bytes %d", b.declared)
	}
	return b.err
}

func (b *uploadBody) Read(p []byte) (int, error) {
	for len(b.chunk) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		if !b.stream.Receive() {
			if err := deadlineErr(b.ctx); err != nil {
				b.err = err
				return 0, err
			}
			if err := b.stream.Err(); err != nil {
				b.err = fmt.Errorf("upload: receiving: %w", err)
				return 0, b.err
			}
			if b.declared >= 0 && b.n != b.declared {
				b.err = errorf(connect.CodeInvalidArgument, "the upload ended after %d of its declared %d bytes", b.n, b.declared)
				return 0, b.err
			}
			b.err = io.EOF
			return 0, io.EOF
		}
		msg := b.stream.Msg()
		if msg.GetName() != "" || msg.SizeBytes != nil {
			b.err = errorf(connect.CodeInvalidArgument, "only the upload's first message may set name or size_bytes")
			return 0, b.err
		}
		b.chunk = msg.GetChunk()
		if err := b.checkChunk(); err != nil {
			return 0, err
		}
	}
	n := copy(p, b.chunk)
	b.chunk = b.chunk[n:]
	return n, nil
}

// byteSize writes n in MiB when it is a whole number of them.
func byteSize(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// checkName accepts a printable UTF-8 label of at most maxNameBytes.
func checkName(name string) error {
	if len(name) > maxNameBytes {
		return errorf(connect.CodeInvalidArgument, "the module name is longer than %d bytes", maxNameBytes)
	}
	if !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return errorf(connect.CodeInvalidArgument, "the module name %q is not printable UTF-8", name)
	}
	return nil
}

func (i ModuleInfo) proto() *moehostv1.ModuleInfo {
	pb := &moehostv1.ModuleInfo{Digest: i.Digest, SizeBytes: i.Size, Name: i.Name, Experts: i.Experts}
	if !i.Created.IsZero() {
		pb.CreateTime = timestamppb.New(i.Created)
	}
	return pb
}

func (s *moduleService) ListModules(ctx context.Context, _ *connect.Request[moehostv1.ListModulesRequest]) (*connect.Response[moehostv1.ListModulesResponse], error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := s.m.List(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	res := &moehostv1.ListModulesResponse{Modules: make([]*moehostv1.ModuleInfo, len(infos))}
	for i, in := range infos {
		res.Modules[i] = in.proto()
	}
	return connect.NewResponse(res), nil
}

func (s *moduleService) DeleteModule(ctx context.Context, req *connect.Request[moehostv1.DeleteModuleRequest]) (*connect.Response[moehostv1.DeleteModuleResponse], error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	digest := req.Msg.GetDigest()
	if err := CheckDigest(digest); err != nil {
		return nil, err
	}
	if err := s.m.Delete(ctx, c, digest); err != nil {
		return nil, fmt.Errorf("delete module %s: %w", digest, err)
	}
	return connect.NewResponse(&moehostv1.DeleteModuleResponse{}), nil
}

func (s *moduleService) DeployExpert(ctx context.Context, req *connect.Request[moehostv1.DeployExpertRequest]) (*connect.Response[moehostv1.DeployExpertResponse], error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	d, err := DeploymentFromProto(req.Msg)
	if err != nil {
		return nil, err
	}
	uids, err := s.m.Deploy(ctx, c, d)
	if err != nil {
		return nil, fmt.Errorf("deploy %q: %w", d.Experts, err)
	}
	return connect.NewResponse(&moehostv1.DeployExpertResponse{Uids: uids}), nil
}

func (s *moduleService) UndeployExpert(ctx context.Context, req *connect.Request[moehostv1.UndeployExpertRequest]) (*connect.Response[moehostv1.UndeployExpertResponse], error) {
	c, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	experts := req.Msg.GetExperts()
	if err := checkExperts(experts); err != nil {
		return nil, err
	}
	uids, err := s.m.Undeploy(ctx, c, experts)
	if err != nil {
		return nil, fmt.Errorf("undeploy %q: %w", experts, err)
	}
	return connect.NewResponse(&moehostv1.UndeployExpertResponse{Uids: uids}), nil
}

// CheckDigest returns an InvalidArgument *connect.Error unless digest
// is "sha256:" and 64 lower-case hex digits (wire.CheckDigest).
func CheckDigest(digest string) error { return invalidRequest(wire.CheckDigest(digest)) }

func checkExperts(experts string) error { return invalidRequest(wire.CheckExperts(experts)) }

// invalidRequest codes one of sdk/wire's refusals of a request as
// InvalidArgument, with its message; nil stays nil.
func invalidRequest(err error) error {
	if err == nil {
		return nil
	}
	return connect.NewError(connect.CodeInvalidArgument, err)
}

// DeploymentFromProto converts and checks a DeployExpertRequest with
// wire.DeploymentFromProto, resolving ACCESS_UNSPECIFIED to DefaultForward
// and DefaultBackward. Its errors are InvalidArgument *connect.Errors.
func DeploymentFromProto(req *moehostv1.DeployExpertRequest) (Deployment, error) {
	d, err := wire.DeploymentFromProto(req)
	if err != nil {
		return Deployment{}, invalidRequest(err)
	}
	return d, nil
}

var _ moehostv1connect.ModuleServiceHandler = (*moduleService)(nil)
