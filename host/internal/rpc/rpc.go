// Package rpc is the server's Connect edge: it serves every moehost.v1
// service (ExpertService, ServerService, ModuleService,
// CheckpointService, DiscoveryService) over Connect, gRPC and gRPC-Web on
// one http.Handler, with gRPC health checks and server reflection.
//
// It checks wire tensors against the expert's declared schema with
// wire.Fit, the server's one schema check of a request, before it admits
// or decodes them. Its own refusals of a request are
// *connect.Errors; every other error is mapped to a Connect code in one
// place, by the [Codes] table its caller hands it, so that the rooms
// behind it keep their own sentinels and never import this package for
// their errors. The rooms themselves are behind small interfaces
// ([Experts], [Modules], [Server], [Discovery] and the checkpoint
// service's), which package host implements or hands on.
package rpc

import (
	"context"
	"math"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/wire"
)

// Expert is one hosted expert as the RPC layer sees it: it deals in wire
// tensors, which the expert's one ingress checks against its schema and
// admits, so that this layer holds no device tensor.
type Expert interface {
	// Info returns the expert's description and counters.
	Info() *moehostv1.ExpertInfo
	// Schema returns the declared inputs and outputs.
	Schema() (inputs, outputs []*moehostv1.TensorSchema)
	// ForwardWire computes outputs for a batch of wire inputs, float32
	// ones sent as outDType (float32, float16 or bfloat16).
	ForwardWire(ctx context.Context, inputs []wire.Raw, outDType abi.DType) ([]wire.Raw, error)
	// BackwardWire computes input gradients for a batch and trains;
	// float32 gradients are sent as gradDType.
	BackwardWire(ctx context.Context, inputs, gradOutputs []wire.Raw, gradDType abi.DType) ([]wire.Raw, error)
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

	// Codes maps the errors of the Experts, Modules and Server behind the
	// handler to Connect codes. Nil maps every error that is not a
	// *connect.Error to Internal.
	Codes Codes

	// Server describes the server for ServerService; nil serves no
	// ServerService.
	Server Server
	// CORSOrigins are the origins whose browser pages may call the
	// procedures; "*" allows any. Default none: same origin only.
	CORSOrigins []string
	// Discovery, when set, serves DiscoveryService from the server's DHT
	// node, to anyone. Nil serves none.
	Discovery Discovery

	// Auth checks bearer tokens. With it, ExpertService and ServerService
	// serve anonymous callers and callers with a valid token (CallerFrom
	// says which), and refuse an invalid token with Unauthenticated.
	// Without it, every caller is anonymous.
	Auth Authenticator
	// Modules, with Auth, serves ModuleService, to callers with a valid
	// token only. Nil serves no ModuleService.
	Modules Modules
	// MaxUploadBytes caps one module upload, separately from
	// MaxRequestBytes. Default DefaultMaxUploadBytes (64 MiB). Uploads,
	// when its MaxBytes is set, replaces it.
	MaxUploadBytes int64
	// Uploads bound each module upload; zero fields take the defaults.
	Uploads UploadLimits
	// Checkpoints, NewCheckpointHandler's handler, is mounted at its path
	// and listed in reflection and health. Nil serves no
	// CheckpointService.
	Checkpoints http.Handler

	// Bodies bound every other request's body (BodyDeadlines); zero
	// fields take the defaults.
	Bodies BodyLimits

	// Metrics, when set, count and time every call of every service
	// served (NewMetrics). Nil counts nothing.
	Metrics *Metrics
}

// smallMessageBytes caps the requests of the services whose requests
// name a thing or two (server info, health, reflection, checkpoints).
const smallMessageBytes = 1 << 20

// NewHandler returns an http.Handler that serves ExpertService,
// ServerService (with opts.Server), gRPC health and gRPC reflection (v1
// and v1alpha) for all three protocols, to the CORS origins allowed,
// ModuleService with opts.Modules and DiscoveryService with
// opts.Discovery. Serve it with HTTP/2 cleartext enabled
// for gRPC clients. Modules without Auth is a wiring bug: it panics.
func NewHandler(experts Experts, opts Options) http.Handler {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = 256 << 20
	}
	// Interceptors run in order: errors are coded outermost, and the
	// caller is known before the handler runs.
	interceptors := []connect.Interceptor{opts.Codes.Interceptor()}
	if opts.Auth != nil {
		interceptors = append(interceptors, gate(authGate{auth: opts.Auth, service: "this service"}.caller))
	}
	intercepted := opts.Metrics.interceptors(interceptors...)
	counted := opts.Metrics.interceptors()
	mux := http.NewServeMux()
	mux.Handle(moehostv1connect.NewExpertServiceHandler(
		&service{experts: experts},
		readLimit(opts.MaxRequestBytes),
		// Responses are never compressed: they are float tensors, which
		// gzip shrinks by a few percent at the cost of more CPU than the
		// expert's own kernels. Compressed requests are still accepted.
		connect.WithCompressMinBytes(math.MaxInt),
		intercepted,
	))
	names := []string{moehostv1connect.ExpertServiceName}
	if opts.Server != nil {
		mux.Handle(moehostv1connect.NewServerServiceHandler(
			serverService{server: opts.Server},
			readLimit(smallMessageBytes),
			intercepted,
		))
		names = append(names, moehostv1connect.ServerServiceName)
	}
	if opts.Modules != nil {
		up := opts.Uploads
		if up.MaxBytes <= 0 {
			up.MaxBytes = opts.MaxUploadBytes
		}
		mux.Handle(newModuleHandler(opts.Modules, opts.Auth, up, opts.Codes, opts.Metrics))
		names = append(names, moehostv1connect.ModuleServiceName)
	}
	if opts.Discovery != nil {
		mux.Handle(discoveryHandler(opts.Discovery, opts.Codes, opts.Metrics))
		names = append(names, moehostv1connect.DiscoveryServiceName)
	}
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker(names...), readLimit(smallMessageBytes), counted))
	resolver, err := reflectionResolver()
	if err != nil {
		panic(err) // the embedded set is generated with the code: a bad one is a build bug
	}
	if opts.Checkpoints != nil {
		mux.Handle("/"+moehostv1connect.CheckpointServiceName+"/", opts.Checkpoints)
		names = append(names, moehostv1connect.CheckpointServiceName)
	}
	// Reflection lists itself too, as grpc-go's does: grpcurl list shows
	// every service it can describe.
	reflected := append(names, grpchealth.HealthV1ServiceName, grpcreflect.ReflectV1ServiceName, grpcreflect.ReflectV1AlphaServiceName)
	reflector := grpcreflect.NewReflector(
		grpcreflect.NamerFunc(func() []string { return reflected }),
		grpcreflect.WithDescriptorResolver(resolver),
	)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, readLimit(smallMessageBytes), counted))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, readLimit(smallMessageBytes), counted))
	if opts.Bodies.Metrics == nil {
		opts.Bodies.Metrics = opts.Metrics
	}
	return BodyDeadlines(withCORS(needContentType(mux, opts.Metrics), opts.CORSOrigins), opts.Bodies)
}
