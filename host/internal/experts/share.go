package experts

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/internal/sched"
)

// instanceSlot is an instance that one or more experts run on, and the
// lock that lets one batch at a time use it. The slot owns the instance:
// experts replace it when it traps, and the last of them closes it.
//
// A batch that finds the instance held takes the slot's spare instance,
// made on first use: the batch that holds the instance is then in guest
// code, off the device (it would hold the device otherwise), maybe
// spinning until its call timeout, and the experts it shares with must
// not wait for that. The device worker has at most two batches of one
// owner in flight (sched's maxInFlight), and a slot's experts have one
// owner, so the spare is free whenever the instance is held. A third
// batch, were there one, waits for the instance off the device.
type instanceSlot struct {
	mu    sync.Mutex // held by the batch on inst; guards users
	inst  *sandbox.Instance
	users int

	spareMu sync.Mutex // held by the batch on spare
	spare   *sandbox.Instance
}

// seat is one of a slot's instances, held by one batch until release.
type seat struct {
	inst **sandbox.Instance
	mu   *sync.Mutex
}

// take holds the slot's instance, or its spare when another batch holds
// the instance, or else waits for the instance off the device.
func (s *instanceSlot) take(ctx context.Context) seat {
	if s.mu.TryLock() {
		return seat{&s.inst, &s.mu}
	}
	if s.spareMu.TryLock() {
		return seat{&s.spare, &s.spareMu}
	}
	lockOffDevice(ctx, &s.mu)
	return seat{&s.inst, &s.mu}
}

func (st seat) release() { st.mu.Unlock() }

// lockOffDevice locks mu for a batch or a task on the device worker (ctx
// is theirs). If mu is held, it lets the device go while it waits: the
// holder may be a batch in guest code that needs the device back to end,
// and waiting for it on the device would deadlock the worker.
func lockOffDevice(ctx context.Context, mu *sync.Mutex) {
	if mu.TryLock() {
		return
	}
	l := sched.LeaseFrom(ctx)
	l.Leave()
	mu.Lock()
	l.Enter()
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
	if s.users > 0 {
		return nil
	}
	var errs []error
	if s.inst != nil {
		errs = append(errs, s.inst.Close(ctx))
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil {
		errs = append(errs, s.spare.Close(ctx))
	}
	return errors.Join(errs...)
}
