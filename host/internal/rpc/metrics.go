package rpc

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count and time every call of every service that NewHandler
// and NewCheckpointHandler serve, by service, method and Connect code,
// as connect's and gRPC's own metric interceptors do. A nil *Metrics
// counts nothing.
//
// They see the calls that reach the services' interceptors: refusals
// by a gate (Unauthenticated, PermissionDenied) and by the rooms behind
// (NotFound, ResourceExhausted for a full queue) are counted by code,
// but connect-go reads a unary request's body before any interceptor
// runs, so a body over the size cap or one cut by BodyDeadlines is
// answered without passing here. The refusals of this package's own HTTP
// wrappers are counted apart, by reason, in moehost_http_refused_total:
// bodies cut by BodyDeadlines or an upload's deadlines (body_idle,
// body_timeout), and the 415 and 405 answers (content_type, method).
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	refused  *prometheus.CounterVec
}

// The reasons of moehost_http_refused_total.
const (
	refusedBodyIdle    = "body_idle"
	refusedBodyTimeout = "body_timeout"
	refusedBodySlow    = "body_slow"
	refusedContentType = "content_type"
	refusedMethod      = "method"
)

// NewMetrics makes the RPC series, moehost_rpc_requests_total and
// moehost_rpc_duration_seconds, and registers them with reg (nil: none,
// for tests). The caller owns reg; this package never builds one.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Name: "rpc_requests_total",
			Help: "RPCs handled, by service, method and Connect code (ok for success).",
		}, []string{"service", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "moehost", Name: "rpc_duration_seconds",
			Help:    "Time an RPC took in its handler, from its request decoded to its response or error, by service and method.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 18), // 100µs to 13s
		}, []string{"service", "method"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "moehost", Name: "http_refused_total",
			Help: "Requests refused before they reached a service, by reason: body_idle and body_timeout (a body cut by its deadlines), content_type (415) and method (405).",
		}, []string{"reason"}),
	}
	for _, r := range []string{refusedBodyIdle, refusedBodyTimeout, refusedBodySlow, refusedContentType, refusedMethod} {
		m.refused.WithLabelValues(r) // every reason shows, at 0 until it happens
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.refused)
	}
	return m
}

// refuse counts a refusal for reason; a nil m counts nothing.
func (m *Metrics) refuse(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

// interceptors returns the interceptors of a service: m's first, so that
// it sees the code that the rest (codes, then any gates) end with.
func (m *Metrics) interceptors(rest ...connect.Interceptor) connect.HandlerOption {
	if m != nil {
		rest = append([]connect.Interceptor{metricsInterceptor{m}}, rest...)
	}
	return connect.WithInterceptors(rest...)
}

// observe records one call of procedure ("/pkg.Service/Method") that
// began at start and ended with err.
func (m *Metrics) observe(procedure string, start time.Time, err error) {
	service, method := splitProcedure(procedure)
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
	}
	m.requests.WithLabelValues(service, method, code).Inc()
	m.duration.WithLabelValues(service, method).Observe(time.Since(start).Seconds())
}

func splitProcedure(procedure string) (service, method string) {
	p := strings.TrimPrefix(procedure, "/")
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return p, ""
}

type metricsInterceptor struct{ m *Metrics }

func (i metricsInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		res, err := next(ctx, req)
		i.m.observe(req.Spec().Procedure, start, err)
		return res, err
	}
}

func (metricsInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i metricsInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		i.m.observe(conn.Spec().Procedure, start, err)
		return err
	}
}
