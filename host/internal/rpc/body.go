package rpc

import (
	"net/http"
	"time"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// BodyLimits bound the request body of every call but UploadModule (which
// has UploadLimits): a body that sends nothing for IdleTimeout, or is not
// all in after Timeout, is cut with DeadlineExceeded. They bound the
// body only: a call whose body arrived in time may run as long as its
// work takes. Zero fields take the defaults.
type BodyLimits struct {
	// IdleTimeout cuts a body whose client sends nothing for this long.
	// Default DefaultBodyIdleTimeout (10s).
	IdleTimeout time.Duration
	// Timeout cuts a body that is not all in this long after the call
	// began, however it trickles. Default DefaultBodyTimeout (30s).
	Timeout time.Duration
	// MinRate cuts a body that has sent less than this many bytes a
	// second on average, MinRateGrace after the call began. Default
	// DefaultMinBodyRate; negative: none.
	MinRate int64
	// Metrics, when set, count the bodies cut. NewHandler sets it to
	// Options.Metrics when it is nil.
	Metrics *Metrics
}

// The defaults of BodyLimits.
const (
	DefaultBodyIdleTimeout = 10 * time.Second
	DefaultBodyTimeout     = 30 * time.Second
)

func (l BodyLimits) withDefaults() BodyLimits {
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultBodyIdleTimeout
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultBodyTimeout
	}
	return l
}

// BodyDeadlines wraps h so that each request's body, but an UploadModule
// stream's, must arrive within limits. The server's own ReadTimeout
// cannot do this: on HTTP/1 it would also cut a long Forward after its
// body is in, and on HTTP/2 it bounds nothing per stream. Without it a
// client that sends a Forward's body a byte a second holds a goroutine,
// a descriptor and a buffer for minutes. NewHandler applies it; a server
// that mounts more beside it wraps the whole (an inner BodyDeadlines then
// passes requests through).
func BodyDeadlines(h http.Handler, limits BodyLimits) http.Handler {
	limits = limits.withDefaults()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, bounded := r.Body.(*deadlineBody); bounded || r.URL.Path == moehostv1connect.ModuleServiceUploadModuleProcedure || r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		b := newDeadlineBody(r.Body, w, "the request body", limits.IdleTimeout, limits.Timeout, minRate(limits.MinRate), limits.Metrics)
		b.coded = true
		// The first deadline is set before the handler runs, so that a
		// body that the handler never reads is bounded too while the
		// server drains it. It is cleared when the body ends (Read).
		_ = b.rc.SetReadDeadline(b.deadline(b.start))
		// The body itself says it is bounded, to an inner BodyDeadlines: a
		// context value would cost every request a copy of r.
		r.Body = b
		h.ServeHTTP(w, r)
	})
}
