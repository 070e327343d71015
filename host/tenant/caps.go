package tenant

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/moehost/moehost/internal/expertlimits"
	"github.com/moehost/moehost/modules"
)

// Caps bound what one tenant may use. In a tenants file a zero (or absent)
// field means the server's default; WithDefaults resolves them.
type Caps struct {
	// Modules caps the modules the tenant has uploaded.
	Modules int64
	// ModuleBytes caps the bytes of those modules, as stored.
	ModuleBytes int64
	// Experts caps the experts the tenant has deployed.
	Experts int64
	// MemoryPages caps each of the tenant's guest memories, in 64 KiB
	// pages (at most 65536, wasm32's whole address space).
	MemoryPages int64
	// CallTimeout caps the wall time of one call into an expert.
	CallTimeout time.Duration
	// BytesPerCall caps the host tensor bytes one call may make.
	BytesPerCall int64
	// ParamBytes caps the parameter bytes of all the tenant's experts
	// together, and so of each one.
	ParamBytes int64
	// QueueShare is the tenant's weight in the fair scheduler: a tenant
	// with share 2 gets twice the device time of one with share 1 when
	// both have work queued.
	QueueShare int64
	// InitTimeout caps the CPU time one of the tenant's instances may
	// take to start (_initialize and moe_init, at nice 19; see
	// sandbox.Limits.LowPriorityInit).
	InitTimeout time.Duration
	// Uploads caps the tenant's module uploads in flight at once.
	Uploads int64
	// Deploys caps the tenant's deploy requests in flight at once.
	Deploys int64
}

// DefaultCaps are the caps of a tenant when neither the tenants file nor
// the server sets them: never unlimited, so that every charge has a
// budget. The guest ones match host/internal/sandbox's defaults.
var DefaultCaps = Caps{
	Modules:      64,
	ModuleBytes:  1 << 30,
	Experts:      1024,
	MemoryPages:  4096,
	CallTimeout:  time.Minute,
	BytesPerCall: 2 << 30,
	ParamBytes:   4 << 30,
	QueueShare:   1,
	InitTimeout:  30 * time.Second,
	Uploads:      2,
	Deploys:      2,
}

// WithDefaults returns c with each zero field taken from serverDefaults,
// and each field still zero from DefaultCaps: the caps that apply.
func (c Caps) WithDefaults(serverDefaults Caps) Caps {
	fill := func(d Caps) {
		pick(&c.Modules, d.Modules)
		pick(&c.ModuleBytes, d.ModuleBytes)
		pick(&c.Experts, d.Experts)
		pick(&c.MemoryPages, d.MemoryPages)
		pick(&c.CallTimeout, d.CallTimeout)
		pick(&c.BytesPerCall, d.BytesPerCall)
		pick(&c.ParamBytes, d.ParamBytes)
		pick(&c.QueueShare, d.QueueShare)
		pick(&c.InitTimeout, d.InitTimeout)
		pick(&c.Uploads, d.Uploads)
		pick(&c.Deploys, d.Deploys)
	}
	fill(serverDefaults)
	fill(DefaultCaps)
	return c
}

func pick[T int64 | time.Duration](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// validate checks that no cap is negative or out of range; each error
// names the cap as the file spells it.
func (c Caps) validate() error {
	for _, f := range c.fields() {
		if f.v < 0 {
			return fmt.Errorf("caps.%s %s: must not be negative", f.name, f.show(f.v))
		}
	}
	if c.MemoryPages > maxMemoryPages {
		return fmt.Errorf("caps.memory_pages %d: more than wasm32's %d", c.MemoryPages, maxMemoryPages)
	}
	if c.QueueShare > maxQueueShare {
		return fmt.Errorf("caps.queue_share %d: more than %d", c.QueueShare, maxQueueShare)
	}
	return nil
}

type capField struct {
	name string
	v    int64
}

func (f capField) show(v int64) string {
	if f.name == "call_timeout" || f.name == "init_timeout" {
		return time.Duration(v).String()
	}
	return fmt.Sprint(v)
}

// fields lists the caps with their names in the file (and, with "cap-"
// and dashes, on the command line).
func (c Caps) fields() []capField {
	return []capField{
		{"modules", c.Modules},
		{"module_bytes", c.ModuleBytes},
		{"experts", c.Experts},
		{"memory_pages", c.MemoryPages},
		{"call_timeout", int64(c.CallTimeout)},
		{"bytes_per_call", c.BytesPerCall},
		{"param_bytes", c.ParamBytes},
		{"queue_share", c.QueueShare},
		{"init_timeout", int64(c.InitTimeout)},
		{"uploads", c.Uploads},
		{"deploys", c.Deploys},
	}
}

// String lists the caps that are set, "modules=8 call_timeout=30s", or
// "defaults" when none is.
func (c Caps) String() string {
	s := ""
	for _, f := range c.fields() {
		if f.v == 0 {
			continue
		}
		if s != "" {
			s += " "
		}
		s += f.name + "=" + f.show(f.v)
	}
	if s == "" {
		return "defaults"
	}
	return s
}

// ErrCapExceeded matches every CapError.
var ErrCapExceeded = errors.New("tenant cap exceeded")

// CapError says which cap a request would break. The RPC edge maps it to
// ResourceExhausted (usage) or InvalidArgument (a limit asked for).
type CapError struct {
	// Cap is the cap's name as the tenants file spells it, "module_bytes".
	Cap string
	// Limit is the cap; Want what the request would need (for usage caps,
	// what is used plus what it adds). Durations are in nanoseconds.
	Limit, Want int64
}

func (e *CapError) Error() string {
	f := capField{name: e.Cap}
	return fmt.Sprintf("the tenant's %s cap is %s and this needs %s", e.Cap, f.show(e.Limit), f.show(e.Want))
}

// Is makes errors.Is(err, ErrCapExceeded) true.
func (e *CapError) Is(target error) bool { return target == ErrCapExceeded }

// Usage is what a tenant holds, or what a request adds, in the caps that
// count things.
type Usage struct {
	Modules, ModuleBytes, Experts, ParamBytes int64
}

// Admit checks, before anything is allocated, that used plus add fits
// in c (resolved with WithDefaults: a zero cap admits only zero). It
// returns a *CapError for the first cap that would be broken. Negative
// counts are treated as zero.
func (c Caps) Admit(used, add Usage) error {
	for _, f := range []struct {
		name             string
		limit, used, add int64
	}{
		{"modules", c.Modules, used.Modules, add.Modules},
		{"module_bytes", c.ModuleBytes, used.ModuleBytes, add.ModuleBytes},
		{"experts", c.Experts, used.Experts, add.Experts},
		{"param_bytes", c.ParamBytes, used.ParamBytes, add.ParamBytes},
	} {
		u, a := max(f.used, 0), max(f.add, 0)
		if a == 0 {
			continue // never refuse nothing, even past a cap lowered by a reload
		}
		if u > f.limit || a > f.limit-u {
			want := u + a
			if want < u { // overflow
				want = 1<<63 - 1
			}
			return &CapError{Cap: f.name, Limit: f.limit, Want: want}
		}
	}
	return nil
}

// Limits are the per-expert limits a deploy request may ask for
// (expertlimits', the one type of them). Zero fields ask for the
// tenant's cap.
type Limits = expertlimits.Limits

// Clamp returns req with each field at most c's cap, and each zero field
// set to the cap. Call it on resolved caps (WithDefaults); a zero cap
// leaves its field as asked.
func (c Caps) Clamp(req Limits) Limits {
	clamp := func(v *int64, limit int64) {
		if limit > 0 && (*v <= 0 || *v > limit) {
			*v = limit
		}
	}
	pages := int64(req.MemoryPages)
	clamp(&pages, c.MemoryPages)
	req.MemoryPages = uint32(min(pages, math.MaxUint32))
	d := int64(req.CallTimeout)
	clamp(&d, int64(c.CallTimeout))
	req.CallTimeout = time.Duration(d)
	clamp(&req.BytesPerCall, c.BytesPerCall)
	clamp(&req.ParamBytes, c.ParamBytes)
	return req
}

// CheckLimits returns a *CapError naming the first field of req above
// its cap in c (resolved with WithDefaults), for a host that refuses
// rather than clamps. Zero fields, and zero caps, pass.
func (c Caps) CheckLimits(req Limits) error {
	for _, f := range []struct {
		name       string
		want, have int64
	}{
		{"memory_pages", int64(req.MemoryPages), c.MemoryPages},
		{"call_timeout", int64(req.CallTimeout), int64(c.CallTimeout)},
		{"bytes_per_call", req.BytesPerCall, c.BytesPerCall},
		{"param_bytes", req.ParamBytes, c.ParamBytes},
	} {
		if f.have > 0 && f.want > f.have {
			return &CapError{Cap: f.name, Limit: f.have, Want: f.want}
		}
	}
	return nil
}

// ModuleQuota returns the module store's quota for these caps (resolved
// with WithDefaults), so that the registry checks uploads against the
// same numbers before it stores a byte.
func (c Caps) ModuleQuota() modules.Quota {
	return modules.Quota{Modules: int(min(c.Modules, math.MaxInt32)), Bytes: c.ModuleBytes}
}
