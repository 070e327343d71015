package sandbox

import "context"

// Gate is a running batch's hold on its device; the device worker's
// lease (package sched) is one. The sandbox calls Leave before guest
// code runs (an export is called, or a host function returns to the
// guest) and Enter before host code that may use the device runs again
// (a moehost_v1 host function, or the export's return), so that a guest
// that spins, or sleeps in a WASI call, does not hold the device while
// other tenants wait. WASI functions run without the device.
type Gate interface {
	Leave()
	Enter()
}

type gateKey struct{}

// WithGate returns ctx with g, for Instantiate, Forward and Backward.
func WithGate(ctx context.Context, g Gate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

// gateFrom returns ctx's gate, or nil.
func gateFrom(ctx context.Context) Gate {
	g, _ := ctx.Value(gateKey{}).(Gate)
	return g
}

type killKey struct{}

// WithKill returns ctx with kill, for Forward and Backward: when kill is
// done, a call under ctx ends at once, wherever the guest is (its
// instance is closed, as at its CallTimeout), while ctx's own end only
// stops it between ops. The server's shutdown uses it once its drain
// timeout is over, for a guest that spins without calling the host.
func WithKill(ctx, kill context.Context) context.Context {
	return context.WithValue(ctx, killKey{}, kill)
}

// killFrom returns ctx's kill context, or nil.
func killFrom(ctx context.Context) context.Context {
	k, _ := ctx.Value(killKey{}).(context.Context)
	return k
}
