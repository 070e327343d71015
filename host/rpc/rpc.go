// Package rpc serves moehost.v1.ExpertService over Connect, gRPC and
// gRPC-Web on one http.Handler, with gRPC health checks and server
// reflection.
//
// It decodes wire tensors, checks them against the expert's declared
// schema before any compute, and maps errors to Connect codes in one place
// ([CodeOf]). The experts themselves are behind the small [Experts]
// interface, which package host implements.
package rpc

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
)

// Errors an Experts implementation wraps its errors with, so that the
// handler can choose the Connect code. Unwrapped errors become Internal.
var (
	ErrNotFound           = errors.New("not found")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrInternal           = errors.New("internal error")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrAlreadyExists      = errors.New("already exists")
	// ErrUnauthenticated: the caller presented no token, or one that no
	// tenant holds, where one is needed.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the caller is known but may not do this (another
	// tenant's module, expert or uid prefix).
	ErrPermissionDenied = errors.New("permission denied")
)

// Expert is one hosted expert as the RPC layer sees it.
type Expert interface {
	// Info returns the expert's description and counters.
	Info() *moehostv1.ExpertInfo
	// Schema returns the declared inputs and outputs.
	Schema() (inputs, outputs []*moehostv1.TensorSchema)
	// Device is where the expert's tensors live.
	Device() gpuhost.Device
	// Forward computes outputs for a batch.
	Forward(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error)
	// Backward computes input gradients for a batch and trains.
	Backward(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error)
}

// Experts looks experts up by uid.
type Experts interface {
	Expert(uid string) (Expert, bool)
	// All returns every expert, sorted by uid.
	All() []Expert
}

// Options configure the handler. Zero fields take the defaults.
type Options struct {
	// MaxRequestBytes caps a request message. Default 256 MiB.
	MaxRequestBytes int

	// Server describes the server for ServerService; nil serves no
	// ServerService.
	Server Server
	// CORSOrigins are the origins whose browser pages may call the
	// procedures; "*" allows any. Default none: same origin only.
	CORSOrigins []string
	// Services are more Connect services to serve beside ExpertService,
	// listed in health checks and reflection.
	Services []Service

	// Auth checks bearer tokens. With it, ExpertService and ServerService
	// serve anonymous callers and callers with a valid token (CallerFrom
	// says which), and refuse an invalid token with Unauthenticated.
	// Without it, every caller is anonymous.
	Auth Authenticator
	// Modules, with Auth, serves ModuleService, to callers with a valid
	// token only. Nil serves no ModuleService.
	Modules Modules
	// MaxUploadBytes caps one module upload, separately from
	// MaxRequestBytes. Default DefaultMaxUploadBytes (64 MiB).
	MaxUploadBytes int64
}

// Service is a Connect service another room built, served on the same
// handler.
type Service struct {
	// Name is the fully-qualified service name ("moehost.v1.DiscoveryService").
	Name string
	// Path and Handler are what its generated New…Handler returned.
	Path    string
	Handler http.Handler
}

// NewHandler returns an http.Handler that serves ExpertService,
// ServerService (with opts.Server), gRPC health and gRPC reflection (v1
// and v1alpha) for all three protocols, to the CORS origins allowed, and
// ModuleService with opts.Modules. Serve it with HTTP/2 cleartext enabled
// for gRPC clients. Modules without Auth is a wiring bug: it panics.
func NewHandler(experts Experts, opts Options) http.Handler {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = 256 << 20
	}
	// Interceptors run in order: errors are coded outermost, and the
	// caller is known before the handler runs.
	interceptors := []connect.Interceptor{errorInterceptor{}}
	if opts.Auth != nil {
		interceptors = append(interceptors, gate(authGate{auth: opts.Auth, service: "this service"}.caller))
	}
	mux := http.NewServeMux()
	mux.Handle(moehostv1connect.NewExpertServiceHandler(
		&service{experts: experts},
		connect.WithReadMaxBytes(opts.MaxRequestBytes),
		// Responses are never compressed: they are float tensors, which
		// gzip shrinks by a few percent at the cost of more CPU than the
		// expert's own kernels. Compressed requests are still accepted.
		connect.WithCompressMinBytes(math.MaxInt),
		connect.WithInterceptors(interceptors...),
	))
	names := []string{moehostv1connect.ExpertServiceName}
	if opts.Server != nil {
		mux.Handle(moehostv1connect.NewServerServiceHandler(
			serverService{server: opts.Server},
			connect.WithInterceptors(interceptors...),
		))
		names = append(names, moehostv1connect.ServerServiceName)
	}
	if opts.Modules != nil {
		mux.Handle(NewModuleHandler(opts.Modules, opts.Auth, opts.MaxUploadBytes))
		names = append(names, moehostv1connect.ModuleServiceName)
	}
	for _, svc := range opts.Services {
		mux.Handle(svc.Path, svc.Handler)
		names = append(names, svc.Name)
	}
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker(names...)))
	resolver, err := reflectionResolver()
	if err != nil {
		panic(err) // the embedded set is generated with the code: a bad one is a build bug
	}
	reflected := append(names, grpchealth.HealthV1ServiceName)
	reflector := grpcreflect.NewReflector(
		grpcreflect.NamerFunc(func() []string { return reflected }),
		grpcreflect.WithDescriptorResolver(resolver),
	)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	return withCORS(mux, opts.CORSOrigins)
}

// CodeOf returns the Connect code for err: the code of a *connect.Error,
// or the code that matches the sentinel err wraps.
func CodeOf(err error) connect.Code {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce.Code()
	case errors.Is(err, ErrNotFound):
		return connect.CodeNotFound
	case errors.Is(err, ErrInvalidArgument):
		return connect.CodeInvalidArgument
	case errors.Is(err, ErrResourceExhausted):
		return connect.CodeResourceExhausted
	case errors.Is(err, ErrUnavailable):
		return connect.CodeUnavailable
	case errors.Is(err, ErrFailedPrecondition):
		return connect.CodeFailedPrecondition
	case errors.Is(err, ErrAlreadyExists):
		return connect.CodeAlreadyExists
	case errors.Is(err, ErrUnauthenticated):
		return connect.CodeUnauthenticated
	case errors.Is(err, ErrPermissionDenied):
		return connect.CodePermissionDenied
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	}
	return connect.CodeInternal
}

// errorInterceptor turns every handler error, unary or streaming, into a
// coded Connect error.
type errorInterceptor struct{}

func (errorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, coded(err)
	}
}

// coded returns err as a *connect.Error with the code CodeOf chooses, or
// nil for nil.
func coded(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(CodeOf(err), withoutSentinel(err))
}

// sentinels are the errors whose text withoutSentinel removes.
var sentinels = []error{ErrNotFound, ErrInvalidArgument, ErrResourceExhausted, ErrUnavailable, ErrInternal, ErrFailedPrecondition, ErrAlreadyExists, ErrUnauthenticated, ErrPermissionDenied}

// withoutSentinel drops the sentinels' text ("invalid argument: ") from
// err's message, since the Connect code says it already and clients print
// both ("invalid_argument: invalid argument: ..."). The result still wraps
// err.
func withoutSentinel(err error) error {
	msg := err.Error()
	for _, s := range sentinels {
		if errors.Is(err, s) {
			msg = strings.Replace(msg, s.Error()+": ", "", 1)
		}
	}
	return &messageError{msg: msg, err: err}
}

// messageError is err with another message.
type messageError struct {
	msg string
	err error
}

func (e *messageError) Error() string { return e.msg }
func (e *messageError) Unwrap() error { return e.err }

func (errorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (errorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return coded(next(ctx, conn))
	}
}
