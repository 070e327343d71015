package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// Spec is a declared input or output: shape[0] is abi.BatchDim.
type Spec struct {
	Name  string
	DType abi.DType
	Shape []int64
}

// String renders the spec as name:dtype[-1,1024].
func (s Spec) String() string {
	dims := make([]string, len(s.Shape))
	for i, d := range s.Shape {
		dims[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s:%v[%s]", s.Name, s.DType, strings.Join(dims, ","))
}

// Binding is what an instance is bound to on the host.
type Binding struct {
	Device gpuhost.Device
	Params *ParamStore
	// Config holds the expert's integer config values (hidden_dim…).
	Config map[string]int64
}

// Instance is one instantiated expert module. It runs one export at a
// time; callers serialise calls.
type Instance struct {
	mod      api.Module
	init     api.Function
	forward  api.Function
	backward api.Function // nil unless the module exports moe_backward
	stderr   *headBuffer
	st       *state

	mu     sync.Mutex
	closed bool
}

// Instantiate makes an instance of m bound to b and runs its moe_init.
func (m *Module) Instantiate(ctx context.Context, b Binding) (*Instance, error) {
	stderr := &headBuffer{max: 4096}
	st := &state{
		dev:    b.Device,
		params: b.Params,
		config: b.Config,
		limits: m.rt.limits,
		phase:  phaseStart,
	}
	clock := &guestClock{st: st}
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(). // reactors: _initialize is called below
		WithStderr(stderr).
		WithNanotime(clock.nanotime, clockResolution).
		WithNanosleep(clock.nanosleep)
	st.nextCall, st.paramBase = newHandleState()
	// With LowPriorityInit, InitTimeout is CPU time (lowPriority) and wall
	// time gets initWallFactor times as long, for a thread that nice 19
	// keeps waiting.
	lim, wall := m.rt.limits, m.rt.limits.InitTimeout
	if lim.LowPriorityInit {
		wall *= initWallFactor
	}
	ictx, cancel := context.WithTimeout(withState(ctx, st), wall)
	if mmapAllocator != nil {
		ictx = experimental.WithMemoryAllocator(ictx, mmapAllocator)
	}
	defer cancel()
	mod, err := m.rt.r.InstantiateModule(ictx, m.compiled, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: instantiating: %w", ErrInvalidModule, err)
	}
	inst := &Instance{
		mod:      mod,
		init:     mod.ExportedFunction(abi.ExportInit),
		forward:  mod.ExportedFunction(abi.ExportForward),
		backward: mod.ExportedFunction(abi.ExportBackward),
		stderr:   stderr,
		st:       st,
	}
	st.gate = gateFrom(ctx)
	if !lim.LowPriorityInit {
		err = inst.start(ictx)
	} else {
		// moe_init is deploy-time guest code, like the compile before
		// it: a tenant whose init spins for its whole init_timeout must
		// not take cores from other tenants' calls (2 spinning inits
		// took both).
		overCPU := lowPriority(ictx, lim.InitTimeout, func(ctx context.Context) { err = inst.start(ctx) })
		switch {
		case err == nil:
		case overCPU:
			err = fmt.Errorf("%w in init: it used its init timeout, %v of CPU time: %w", ErrTrap, lim.InitTimeout, context.DeadlineExceeded)
		case errors.Is(ictx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
			err = fmt.Errorf("%w in init: it did not finish in %v, %d times its init timeout of %v of CPU time (a busy host kept it waiting): %w",
				ErrTrap, wall, initWallFactor, lim.InitTimeout, context.DeadlineExceeded)
		}
	}
	st.gate = nil
	if err != nil {
		inst.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return inst, nil
}

// start runs _initialize, checks the ABI version and runs moe_init.
func (inst *Instance) start(ctx context.Context) error {
	if f := inst.mod.ExportedFunction(abi.ExportInitialize); f != nil {
		if _, err := inst.invoke(ctx, f); err != nil {
			return inst.trap(abi.ExportInitialize, err)
		}
	}
	res, err := inst.invoke(ctx, inst.mod.ExportedFunction(abi.ExportABIVersion))
	if err != nil {
		err = inst.trap(abi.ExportABIVersion, err)
		if inst.mod.ExportedFunction("_start") != nil && inst.mod.ExportedFunction(abi.ExportInitialize) == nil {
			// A WASI command's exports trap before _start; an expert
			// must be a reactor, which the host initialises itself.
			err = fmt.Errorf("%w: %w; the module is a WASI command (it exports _start): build a Go expert with -buildmode=c-shared, a C one with -mexec-model=reactor", ErrInvalidModule, err)
		}
		return err
	}
	if v := int32(res[0]); v != abi.Version {
		return fmt.Errorf("%w: %s returned %d; this host serves ABI version %d with module %s", ErrInvalidModule, abi.ExportABIVersion, v, abi.Version, abi.ModuleName)
	}
	inst.st.phase = phaseInit
	if err := inst.call(ctx, inst.init, abi.ExportInit); err != nil {
		if cerr := inst.st.checkConfigRead(); cerr != nil {
			// A misspelt key is the likelier cause: name it first.
			return fmt.Errorf("%w (then %s failed: %w)", cerr, abi.ExportInit, err)
		}
		if refused := inst.st.configRefused(err); refused != nil {
			return refused
		}
		return fmt.Errorf("%w: %w", ErrInvalidModule, err)
	}
	st := inst.st
	if len(st.inputs) == 0 || len(st.outputs) == 0 {
		return fmt.Errorf("%w: %s declared %d inputs and %d outputs; at least one of each is needed", ErrInvalidModule, abi.ExportInit, len(st.inputs), len(st.outputs))
	}
	if err := st.checkConfigRead(); err != nil {
		return err
	}
	st.phase = phaseIdle
	return nil
}

// checkConfigRead refuses config keys that moe_init never asked for: a
// misspelt key would otherwise be ignored while the module ran on its
// default.
func (st *state) checkConfigRead() error {
	var unknown []string
	for k := range st.config {
		if !st.configRead[k] {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	known := "none"
	if len(st.configRead) > 0 {
		known = strings.Join(slices.Sorted(maps.Keys(st.configRead)), ", ")
	}
	return fmt.Errorf("%w: %s: the module's %s does not read it (it reads: %s)", ErrUnknownConfigKey, strings.Join(unknown, ", "), abi.ExportInit, known)
}

// configRefused returns moe_init's failure err as a refusal of the
// config, when that is what it is: moe_init read config keys and returned
// ErrInvalidArgument (ffn's "hidden_dim must be positive"). A module that
// fails so is not invalid; the caller's value is, and the message says
// which values the module read. Otherwise it returns nil.
func (st *state) configRefused(err error) error {
	var ge *GuestError
	if !errors.As(err, &ge) || ge.Code != abi.ErrInvalidArgument || len(st.configRead) == 0 {
		return nil
	}
	var vals []string
	for _, k := range slices.Sorted(maps.Keys(st.configRead)) {
		if v, ok := st.config[k]; ok {
			vals = append(vals, fmt.Sprintf("%s=%d", k, v))
		}
	}
	if len(vals) == 0 {
		return nil // it read none that was given: its defaults failed
	}
	return &configRefusedError{config: strings.Join(vals, ","), guest: ge}
}

// configRefusedError is ErrConfigRefused naming the values refused and
// the module's own reason. It unwraps to the GuestError.
type configRefusedError struct {
	config string
	guest  *GuestError
}

func (e *configRefusedError) Error() string {
	msg := e.guest.Msg
	if msg == "" {
		msg = e.guest.Code.String()
	}
	return fmt.Sprintf("config %s refused by the module's %s: %s", e.config, abi.ExportInit, msg)
}

func (e *configRefusedError) Is(target error) bool { return target == ErrConfigRefused }

func (e *configRefusedError) Unwrap() error { return e.guest }

// Inputs returns the declared inputs.
func (inst *Instance) Inputs() []Spec { return slices.Clone(inst.st.inputs) }

// Outputs returns the declared outputs.
func (inst *Instance) Outputs() []Spec { return slices.Clone(inst.st.outputs) }

// Forward runs moe_forward on one batch. When tape is not nil the ops are
// recorded on it. The inputs must match the declared schema with one
// batch size; the outputs are returned in declaration order.
func (inst *Instance) Forward(ctx context.Context, inputs []*gpuhost.Tensor, tape *gpuhost.Tape) ([]*gpuhost.Tensor, error) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.closed {
		return nil, ErrClosed
	}
	st := inst.st
	batch, err := batchOf(st, inputs, nil)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s skipped: %w", abi.ExportForward, err)
	}
	if err := st.drawParams(); err != nil {
		return nil, err
	}
	st.beginCall(phaseForward, inputs, nil, batch, tape)
	defer st.endCall()
	st.gate = gateFrom(ctx)
	defer func() { st.gate = nil }()
	run, cancel := inst.callContext(ctx)
	defer cancel()
	if err := inst.call(run, inst.forward, abi.ExportForward); err != nil || st.spent {
		return nil, inst.retireIfSpent(err)
	}
	for i, out := range st.callOutputs {
		if out == nil {
			return nil, fmt.Errorf("%w: %s returned without setting output %d (%s)", ErrGuest, abi.ExportForward, i, st.outputs[i])
		}
	}
	return slices.Clone(st.callOutputs), nil
}

// CallStats is what the last moe_forward or moe_backward of an instance
// used of its per-call budgets.
type CallStats struct {
	Ops       int   // op, op_multi and tensor_new calls
	HostCalls int   // calls of any host function
	Bytes     int64 // host memory charged: tensor bytes plus TensorOverhead each
}

// LastCall returns the budgets used by the last call, failed or not.
func (inst *Instance) LastCall() CallStats {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return CallStats{Ops: inst.st.ops, HostCalls: inst.st.hostCalls, Bytes: inst.st.bytes}
}

// NewParamStore makes the parameters of another expert that shares this
// instance: the parameters moe_init declared, in its order, initialised as
// a fresh instance's moe_init would initialise them from seed. maxBytes is
// as for the package's NewParamStore.
func (inst *Instance) NewParamStore(seed []byte, maxBytes int64) (*ParamStore, error) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	ps := NewParamStore(inst.st.dev, seed, maxBytes)
	for _, d := range inst.st.paramDecls {
		if _, err := ps.declare(d.name, d.dt, d.shape, d.init, d.a, d.b); err != nil {
			return nil, fmt.Errorf("param %q: %w", d.name, err)
		}
	}
	return ps, nil
}

// Bind makes the instance compute with ps's parameters from its next call
// on: its parameter handles resolve to ps's tensors. ps must hold the
// parameters this instance's moe_init declared, in its order (its own
// store, or one from NewParamStore). Binding is what lets experts of one
// module and config share an instance; the guest must keep nothing that
// differs between experts outside its parameters.
func (inst *Instance) Bind(ps *ParamStore) error {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	st := inst.st
	if st.params == ps {
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.params) != len(st.paramEntries) {
		return fmt.Errorf("%w: binding %d parameters to an instance that declared %d", ErrInvalidInput, len(ps.params), len(st.paramEntries))
	}
	for i, p := range ps.params {
		d := st.paramDecls[i]
		if p.Name != d.name || !slices.Equal(p.Tensor.Shape(), d.shape) {
			return fmt.Errorf("%w: parameter %d is %s%v, the instance declared %s%v", ErrInvalidInput, i, p.Name, p.Tensor.Shape(), d.name, d.shape)
		}
	}
	for i, p := range ps.params {
		st.paramEntries[i].t = p.Tensor
	}
	st.params = ps
	return nil
}

// HasBackward reports whether the module brings its own backward
// (moe_backward) instead of relying on the host's tape.
func (inst *Instance) HasBackward() bool { return inst.backward != nil }

// Backward runs moe_backward on one batch: the inputs and the gradients of
// the outputs go in; the gradients of the inputs (nil for inputs that are
// not float32) and of the parameters the guest gave come out.
func (inst *Instance) Backward(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, map[*gpuhost.Tensor]*gpuhost.Tensor, error) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.closed {
		return nil, nil, ErrClosed
	}
	if inst.backward == nil {
		return nil, nil, fmt.Errorf("%w: the module does not export %s", ErrGuest, abi.ExportBackward)
	}
	st := inst.st
	batch, err := batchOf(st, inputs, gradOutputs)
	if err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s skipped: %w", abi.ExportBackward, err)
	}
	if err := st.drawParams(); err != nil {
		return nil, nil, err
	}
	st.beginCall(phaseBackward, inputs, gradOutputs, batch, nil)
	defer st.endCall()
	st.gate = gateFrom(ctx)
	defer func() { st.gate = nil }()
	run, cancel := inst.callContext(ctx)
	defer cancel()
	if err := inst.call(run, inst.backward, abi.ExportBackward); err != nil || st.spent {
		return nil, nil, inst.retireIfSpent(err)
	}
	for i, g := range st.gradInputs {
		if g == nil && st.inputs[i].DType == abi.DTypeFloat32 {
			return nil, nil, fmt.Errorf("%w: %s returned without the gradient of input %d (%s)", ErrGuest, abi.ExportBackward, i, st.inputs[i])
		}
	}
	return slices.Clone(st.gradInputs), st.paramGrads, nil
}

// drawParams draws the initial values of the bound parameters that have
// none yet (see ParamStore), so that no call computes with a parameter
// before it holds values.
func (st *state) drawParams() error {
	if st.params == nil {
		return nil
	}
	return st.params.Draw()
}

// batchOf returns the batch size of a call's tensors. It is no schema
// check: the host checks each request's tensors against the declared
// schema once, before it batches them (wire.Fit), and hands an instance
// only batches of requests that fit. It checks what keeps the instance's
// own bookkeeping in bounds if that were ever not so: one tensor for each
// declared input (and output gradient, for a backward), each with a batch
// dimension of the same positive size. A call that fails it is a host
// bug, refused as ErrInvalidInput.
func batchOf(st *state, inputs, gradOutputs []*gpuhost.Tensor) (int, error) {
	if len(inputs) != len(st.inputs) || (gradOutputs != nil && len(gradOutputs) != len(st.outputs)) {
		return 0, fmt.Errorf("%w: BUG: a call of %d inputs and %d output gradients; the module declared %d inputs (%s) and %d outputs (%s)",
			ErrInvalidInput, len(inputs), len(gradOutputs), len(st.inputs), specList(st.inputs), len(st.outputs), specList(st.outputs))
	}
	batch := -1
	for i, t := range slices.Concat(inputs, gradOutputs) {
		if t == nil || len(t.Shape()) == 0 || t.Shape()[0] <= 0 || (batch >= 0 && t.Shape()[0] != batch) {
			return 0, fmt.Errorf("%w: BUG: tensor %d of a call has no batch dimension of size %d", ErrInvalidInput, i, batch)
		}
		batch = t.Shape()[0]
	}
	return batch, nil
}

// checkSpec checks one tensor against its spec; batch < 0 accepts any
// positive batch size. It checks what a guest returns (claim).
func checkSpec(s Spec, t *gpuhost.Tensor, batch int) error {
	shape := t.Shape()
	ok := t.DType() == s.DType && len(shape) == len(s.Shape) && len(shape) > 0 && shape[0] > 0 && (batch < 0 || shape[0] == batch)
	for i := 1; ok && i < len(shape); i++ {
		ok = int64(shape[i]) == s.Shape[i]
	}
	if !ok {
		want := s.String()
		if batch >= 0 {
			want += fmt.Sprintf(" with batch %d", batch)
		}
		return fmt.Errorf("got %v%v, want %s", t.DType(), shape, want)
	}
	return nil
}

func specList(specs []Spec) string {
	s := make([]string, len(specs))
	for i, sp := range specs {
		s[i] = sp.String()
	}
	return strings.Join(s, ", ")
}

// callContext splits the caller's ctx for one forward or backward. The
// guest runs under the returned context, which keeps ctx's values but
// neither its cancellation nor its deadline, only the instance's own
// CallTimeout: wazero closes an instance whose context ends, and a caller
// who leaves must not cost the instance. The caller's ctx, bounded by
// CallTimeout too, becomes the call's stop signal instead: host functions
// refuse to start an op once it is done and kernels stop between chunks,
// so the guest gets an error code at a safe point and returns. A kill
// context (WithKill) ends the guest's own context, wherever it is.
func (inst *Instance) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := inst.st.limits.CallTimeout
	stop, cancelStop := context.WithTimeout(ctx, timeout)
	inst.st.stop = stop
	run, cancelRun := context.WithTimeout(withState(context.WithoutCancel(ctx), inst.st), timeout)
	stopKill := func() bool { return false }
	if kill := killFrom(ctx); kill != nil {
		stopKill = context.AfterFunc(kill, cancelRun)
	}
	return run, func() {
		stopKill()
		cancelRun()
		cancelStop()
		inst.st.stop = nil
	}
}

// call runs an export and turns its failure into ErrGuest or ErrTrap. A
// guest that fails after its call was stopped gets the stop's error, so
// that the caller sees a cancellation or a deadline, not a guest error.
func (inst *Instance) call(ctx context.Context, f api.Function, name string) error {
	res, err := inst.invoke(ctx, f)
	if err != nil {
		return inst.trap(name, err)
	}
	if stop := inst.st.stop; inst.st.sleepCut && stop != nil && stop.Err() != nil {
		// The guest did not get the sleep it asked for: whatever it
		// returned, the call ends as stopped.
		return fmt.Errorf("%s stopped in a sleep: %w", name, stop.Err())
	}
	if code := int32(res[0]); code < 0 {
		if stop := inst.st.stop; stop != nil && stop.Err() != nil {
			return fmt.Errorf("%s stopped between ops: %w", name, stop.Err())
		}
		msg := inst.st.guestErr
		if msg == "" {
			msg = inst.st.lastErr
		}
		return &GuestError{Export: name, Code: abi.Errno(code), Msg: msg}
	}
	return nil
}

// invoke calls an export with the device left to others while the guest
// runs (see Gate).
func (inst *Instance) invoke(ctx context.Context, f api.Function) ([]uint64, error) {
	if g := inst.st.gate; g != nil {
		g.Leave()
		defer g.Enter()
	}
	return f.Call(ctx)
}

// GuestError is an export's negative result. It matches ErrGuest.
type GuestError struct {
	Export string    // e.g. "moe_forward"
	Code   abi.Errno // what the export returned
	Msg    string    // the guest's own message, or the host's last error
}

func (e *GuestError) Error() string {
	msg := e.Msg
	if msg == "" {
		msg = e.Code.String()
	}
	if strings.Contains(msg, e.Code.String()) {
		// The message names the code already: say it once.
		return fmt.Sprintf("%v: %s returned %d: %s", ErrGuest, e.Export, int32(e.Code), msg)
	}
	return fmt.Sprintf("%v: %s returned %d (%v): %s", ErrGuest, e.Export, int32(e.Code), e.Code, msg)
}

// Is makes errors.Is(err, ErrGuest) true, and errors.Is(err, ErrBudget)
// for a guest that returned abi.ErrBudgetExceeded.
func (e *GuestError) Is(target error) bool {
	return target == ErrGuest || target == ErrBudget && e.Code == abi.ErrBudgetExceeded
}

// retireIfSpent closes an instance that has given out all of its call
// handles, so that the host replaces it instead of letting a handle
// number come round again; otherwise it returns err.
func (inst *Instance) retireIfSpent(err error) error {
	if !inst.st.spent {
		return err
	}
	if !inst.closed {
		inst.closed = true
		_ = inst.mod.Close(context.Background())
	}
	return fmt.Errorf("%w: the instance gave out all of its call handles and is retired (%v)", ErrTrap, err)
}

// trap closes the instance after a trap and describes the trap.
func (inst *Instance) trap(name string, err error) error {
	inst.closed = true
	_ = inst.mod.Close(context.Background())
	var exit *sys.ExitError
	msg := firstLine(err.Error())
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return fmt.Errorf("%w in %s: %w", ErrTrap, name, context.DeadlineExceeded)
		case sys.ExitCodeContextCanceled:
			return fmt.Errorf("%w in %s: %w", ErrTrap, name, context.Canceled)
		}
		msg = fmt.Sprintf("guest exited with code %d", exit.ExitCode())
	}
	if tail := inst.stderr.firstLines(2); tail != "" {
		msg += " (stderr: " + tail + ")"
	}
	return fmt.Errorf("%w in %s: %s", ErrTrap, name, msg)
}

// Closed reports whether the instance trapped or was closed.
func (inst *Instance) Closed() bool {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.closed
}

// Close releases the instance.
func (inst *Instance) Close(ctx context.Context) error {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.closed {
		return nil
	}
	inst.closed = true
	return inst.mod.Close(ctx)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// headBuffer keeps the first max bytes written to it, so that a guest's
// panic message can name its trap without letting it fill host memory.
type headBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// firstLines returns up to n non-empty lines, joined by "; ".
func (b *headBuffer) firstLines(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][]byte
	for _, l := range bytes.Split(b.buf, []byte("\n")) {
		if l = bytes.TrimSpace(l); len(l) > 0 && len(out) < n {
			out = append(out, l)
		}
	}
	return string(bytes.Join(out, []byte("; ")))
}
