package wire

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/internal/batching"
	"github.com/moehost/moehost/internal/expertlimits"
)

// ErrInvalidRequest is wrapped by every refusal of DeploymentFromProto,
// CheckDigest and CheckExperts: the request is wrong on the wire, before
// any server looks at it. The server answers it with InvalidArgument; a
// client (the CLI) can refuse it before it sends anything. Its text is
// not part of the refusals' messages.
var ErrInvalidRequest = errors.New("invalid request")

// requestError is a refusal of a request: its message is err's alone,
// and it wraps both ErrInvalidRequest and err.
type requestError struct{ err error }

func (e *requestError) Error() string   { return e.err.Error() }
func (e *requestError) Unwrap() []error { return []error{ErrInvalidRequest, e.err} }

// invalid returns a refusal with the formatted message.
func invalid(format string, args ...any) error {
	return &requestError{err: fmt.Errorf(format, args...)}
}

// Limits of ModuleService's requests, which the server and the CLI check
// alike.
const (
	// MaxNameBytes caps a module's name and a config key.
	MaxNameBytes = 256
	// MaxExpertsBytes caps a uid or uid pattern.
	MaxExpertsBytes = 1024
	// MaxConfigKeys caps a deployment's config entries.
	MaxConfigKeys = 256
)

// Access says who may call one of an expert's procedures.
type Access int

// The accesses. The zero Access is not valid: DeploymentFromProto
// resolves the wire's ACCESS_UNSPECIFIED to the procedure's default
// (DefaultForward, DefaultBackward).
const (
	// AccessPublic lets anyone call, with or without a token.
	AccessPublic Access = iota + 1
	// AccessOwner lets only the owner tenant (and the operator) call.
	AccessOwner
	// AccessTenants lets any caller with a valid token call.
	AccessTenants
)

// The defaults for ACCESS_UNSPECIFIED. Backward changes the expert's
// parameters, so only its owner may call it unless the deployment says
// otherwise (RATIONALE: "Why is Backward owner-only by default?").
const (
	DefaultForward  = AccessPublic
	DefaultBackward = AccessOwner
)

// String returns the access as the CLI spells it: "public", "owner" or
// "tenants".
func (a Access) String() string {
	switch a {
	case AccessPublic:
		return "public"
	case AccessOwner:
		return "owner"
	case AccessTenants:
		return "tenants"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// ParseAccess parses String's output, in any case.
func ParseAccess(s string) (Access, error) {
	for _, a := range []Access{AccessPublic, AccessOwner, AccessTenants} {
		if strings.EqualFold(s, a.String()) {
			return a, nil
		}
	}
	return 0, fmt.Errorf("access %q is not public, owner or tenants", s)
}

// Proto is a's wire form; an invalid a is ACCESS_UNSPECIFIED.
func (a Access) Proto() moehostv1.Access {
	switch a {
	case AccessPublic:
		return moehostv1.Access_ACCESS_PUBLIC
	case AccessOwner:
		return moehostv1.Access_ACCESS_OWNER
	case AccessTenants:
		return moehostv1.Access_ACCESS_TENANTS
	}
	return moehostv1.Access_ACCESS_UNSPECIFIED
}

// AccessFromProto converts a wire Access, resolving ACCESS_UNSPECIFIED to
// def. An unknown a is refused (ErrInvalidRequest).
func AccessFromProto(a moehostv1.Access, def Access) (Access, error) {
	switch a {
	case moehostv1.Access_ACCESS_UNSPECIFIED:
		return def, nil
	case moehostv1.Access_ACCESS_PUBLIC:
		return AccessPublic, nil
	case moehostv1.Access_ACCESS_OWNER:
		return AccessOwner, nil
	case moehostv1.Access_ACCESS_TENANTS:
		return AccessTenants, nil
	}
	return 0, invalid("%d is not a known access", a)
}

// BatchLimits is internal/batching's, the one set of batch limits of the
// pools, the server and the wire.
type BatchLimits = batching.Limits

// ExpertLimits bound one expert's calls; zero fields take the tenant's
// caps. They are expertlimits', the one type of them.
type ExpertLimits = expertlimits.Limits

// Deployment is a DeployExpertRequest checked for wire-level sanity
// (non-negative limits, a well-formed digest, known accesses, finite
// numbers); the server checks the rest (patterns, prefixes, caps,
// optimizer names).
type Deployment struct {
	// Experts is one uid or a uid pattern ("alice.ffn.[0:4]").
	Experts string
	// Module is the module's digest.
	Module string
	// Config holds the module's integer settings; never nil.
	Config map[string]int64
	// Optimizer is the request's, checked, or nil for the server's
	// default optimizer.
	Optimizer *moehostv1.OptimizerConfig
	// Batching's zero fields take the server's batch limits.
	Batching BatchLimits
	// Limits' zero fields take the tenant's caps.
	Limits ExpertLimits
	// Forward and Backward say who may call each; never zero.
	Forward, Backward Access
}

// DeploymentFromProto converts and checks a DeployExpertRequest, resolving
// ACCESS_UNSPECIFIED to DefaultForward and DefaultBackward. It is the one
// check of the request's wire-level sanity: the server runs it on every
// DeployExpert, and the CLI before it sends one. Its errors wrap
// ErrInvalidRequest.
func DeploymentFromProto(req *moehostv1.DeployExpertRequest) (Deployment, error) {
	bad := func(format string, args ...any) (Deployment, error) {
		return Deployment{}, invalid(format, args...)
	}
	d := Deployment{Experts: req.GetExperts(), Module: req.GetModuleDigest(), Config: map[string]int64{}}
	if err := CheckExperts(d.Experts); err != nil {
		return Deployment{}, err
	}
	if err := CheckDigest(d.Module); err != nil {
		return Deployment{}, err
	}
	if len(req.GetConfig()) > MaxConfigKeys {
		return bad("config has %d keys, more than %d", len(req.GetConfig()), MaxConfigKeys)
	}
	for k, v := range req.GetConfig() {
		if k == "" || len(k) > MaxNameBytes || !utf8.ValidString(k) {
			return bad("config key %q is empty, too long or not UTF-8", k)
		}
		d.Config[k] = v
	}
	if o := req.GetOptimizer(); o != nil {
		for _, f := range []struct {
			name string
			v    float64
		}{{"lr", o.GetLr()}, {"momentum", o.GetMomentum()}, {"weight_decay", o.GetWeightDecay()}, {"clip_grad_norm", o.GetClipGradNorm()}} {
			if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
				return bad("optimizer %s %v is not a finite non-negative number", f.name, f.v)
			}
		}
		if o.GetNumWarmupSteps() < 0 || o.GetNumTrainingSteps() < 0 {
			return bad("optimizer steps must not be negative")
		}
		d.Optimizer = o
	}
	if b := req.GetBatching(); b != nil {
		if b.GetMaxBatchSize() < 0 || b.GetMinBatchSize() < 0 || b.GetQueueSize() < 0 {
			return bad("batching sizes must not be negative")
		}
		wait, err := duration("batching max_wait", b.GetMaxWait())
		if err != nil {
			return Deployment{}, err
		}
		d.Batching = BatchLimits{MaxBatchSize: int(b.GetMaxBatchSize()), MinBatchSize: int(b.GetMinBatchSize()), MaxWait: wait, QueueSize: int(b.GetQueueSize())}
	}
	if l := req.GetLimits(); l != nil {
		if l.GetBytesPerCall() < 0 || l.GetParamBytes() < 0 {
			return bad("limits must not be negative")
		}
		timeout, err := duration("limits call_timeout", l.GetCallTimeout())
		if err != nil {
			return Deployment{}, err
		}
		d.Limits = ExpertLimits{CallTimeout: timeout, BytesPerCall: l.GetBytesPerCall(), ParamBytes: l.GetParamBytes(), MemoryPages: l.GetMemoryPages()}
	}
	var err error
	if d.Forward, err = AccessFromProto(req.GetForwardAccess(), DefaultForward); err != nil {
		return bad("forward_access %w", err)
	}
	if d.Backward, err = AccessFromProto(req.GetBackwardAccess(), DefaultBackward); err != nil {
		return bad("backward_access %w", err)
	}
	return d, nil
}

// CheckDigest refuses (ErrInvalidRequest) a digest that is not "sha256:"
// and 64 lower-case hex digits.
func CheckDigest(digest string) error {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.ContainsFunc(hex, func(r rune) bool { return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') }) {
		return invalid("module digest %q is not \"sha256:\" and 64 lower-case hex digits", digest)
	}
	return nil
}

// CheckExperts refuses (ErrInvalidRequest) a uid or uid pattern that is
// empty, longer than MaxExpertsBytes or not UTF-8.
func CheckExperts(experts string) error {
	switch {
	case experts == "":
		return invalid("experts (a uid or uid pattern) is empty")
	case len(experts) > MaxExpertsBytes:
		return invalid("experts is longer than %d bytes", MaxExpertsBytes)
	case !utf8.ValidString(experts):
		return invalid("experts is not UTF-8")
	}
	return nil
}

// duration converts an optional non-negative duration; nil is 0.
func duration(what string, pb *durationpb.Duration) (time.Duration, error) {
	if pb == nil {
		return 0, nil
	}
	if err := pb.CheckValid(); err != nil {
		return 0, invalid("%s: %w", what, err)
	}
	if d := pb.AsDuration(); d >= 0 {
		return d, nil
	}
	return 0, invalid("%s %v is negative", what, pb.AsDuration())
}
