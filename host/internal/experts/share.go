package experts

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// instanceSlot is an instance that one or more experts run on, and the
// lock that lets one batch at a time use it. The slot owns the instance:
// experts replace it when it traps, and the last of them closes it.
type instanceSlot struct {
	mu    sync.Mutex
	inst  *sandbox.Instance
	users int
}

// shareKey identifies the experts that may share an instance: one module
// and one config.
func shareKey(digest string, config map[string]int64) string {
	var b strings.Builder
	b.WriteString(digest)
	for _, k := range slices.Sorted(maps.Keys(config)) {
		fmt.Fprintf(&b, "\x00%s=%d", k, config[k])
	}
	return b.String()
}

// newSharedExpert makes an expert for uid on slot's instance: its own
// parameters, drawn from its uid as on an instance of its own, and the
// instance's schema.
func newSharedExpert(uid string, slot *instanceSlot, module *sandbox.Module, dev gpuhost.Device, config map[string]int64, opt gpuhost.Optimizer, paramBytes int64) (*Expert, error) {
	slot.mu.Lock()
	defer slot.mu.Unlock()
	ps, err := slot.inst.NewParamStore([]byte(uid), paramBytes)
	if err != nil {
		return nil, fmt.Errorf("loading expert %q: %w", uid, err)
	}
	slot.users++
	return &Expert{
		uid:     uid,
		guest:   guest{module: module, binding: sandbox.Binding{Device: dev, Params: ps, Config: maps.Clone(config)}, slot: slot},
		schema:  schemaOf(slot.inst),
		trainer: trainer{opt: opt},
	}, nil
}

// idle reports whether no expert uses the slot any more.
func (s *instanceSlot) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users == 0
}

// closeSlot closes the slot's instance when its last user leaves.
func (s *instanceSlot) close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
	if s.users > 0 || s.inst == nil {
		return nil
	}
	return s.inst.Close(ctx)
}
