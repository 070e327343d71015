package sandbox

import (
	"context"
	"fmt"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// wasiCounter counts a guest's WASI calls against HostCallsPerCall, as
// wrap counts the ABI's: every host function a guest can call costs the
// host something, and one budget covers them all. It listens on the WASI
// host module only (wazero calls a host module's listeners around its Go
// functions), so guest code pays nothing for it.
type wasiCounter struct{}

func (wasiCounter) NewFunctionListener(api.FunctionDefinition) experimental.FunctionListener {
	return wasiCounter{}
}

// Before counts the call. Past the budget it panics, which fails the
// export call as a trap: a WASI function has no way to say "budget
// exceeded", and a guest that spins on the clock is not worth keeping.
func (wasiCounter) Before(ctx context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64, _ experimental.StackIterator) {
	st := stateFrom(ctx)
	if st == nil {
		return
	}
	if st.hostCalls >= st.limits.HostCallsPerCall {
		panic(fmt.Errorf("more than %d host calls in one call (the last was %s.%s)",
			st.limits.HostCallsPerCall, wasiModule, def.Name()))
	}
	st.hostCalls++
}

func (wasiCounter) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {}

func (wasiCounter) Abort(context.Context, api.Module, api.FunctionDefinition, error) {}
