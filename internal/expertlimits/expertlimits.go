// Package expertlimits holds the limits of one expert's calls: one type
// for the sandbox that enforces them, the tenants' caps that bound them,
// the server's expert specs and the wire, which may not import each other.
package expertlimits

import "time"

// Limits bound one expert's calls. Zero fields take the limits of the
// expert's owner (the server's, or a tenant's caps).
type Limits struct {
	// MemoryPages caps guest linear memory, in 64 KiB pages.
	MemoryPages uint32
	// CallTimeout bounds one moe_forward or moe_backward call.
	CallTimeout time.Duration
	// BytesPerCall caps the host memory one call may make.
	BytesPerCall int64
	// ParamBytes caps the expert's parameter bytes, overhead included.
	ParamBytes int64
}

// Over returns base with l's non-zero fields in place of its own: an
// expert's own limits over its owner's.
func (l Limits) Over(base Limits) Limits {
	if l.MemoryPages > 0 {
		base.MemoryPages = l.MemoryPages
	}
	if l.CallTimeout > 0 {
		base.CallTimeout = l.CallTimeout
	}
	if l.BytesPerCall > 0 {
		base.BytesPerCall = l.BytesPerCall
	}
	if l.ParamBytes > 0 {
		base.ParamBytes = l.ParamBytes
	}
	return base
}

// IsZero reports whether l asks for nothing of its own.
func (l Limits) IsZero() bool { return l == Limits{} }
