package experts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/internal/sched"
	"github.com/moehost/moehost/modules"
)

// loader turns ExpertConfigs into running experts and takes them apart
// again. Start uses it for the configured experts and Deploy for live
// ones, so that both compile each module digest once per owner and let
// experts of one owner, module and config share an instance. Each owner
// (tenant) gets its own wazero runtime with its own limits, made with its
// first expert; all of them share one compilation cache. Its maps are
// guarded by mu, which is held only while they change: a module compiles,
// and an instance starts and runs moe_init, with mu released, so that one
// tenant's slow deploy does not hold up another's uploads and deploys
// (RATIONALE: "Why does a deploy not hold the loader's lock?").
type loader struct {
	mu       sync.Mutex
	cache    *sandbox.Cache                    // nil: compile without one
	limits   func(owner string) sandbox.Limits // an owner's limits, before an expert's own
	store    *modules.Store
	runtimes map[string]*ownerRuntime   // by owner and limits (runtimeKey)
	compiled map[string]*compiledModule // by owner and digest
	slots    map[string]*instanceSlot   // by owner and shareKey
	// quarantines are the tenants' quarantines, by owner: they outlive
	// the tenants' experts (see quarantineOf).
	quarantines map[string]*quarantine
	// unrestored are deployments from the file that did not load at
	// Start; they stay in the file until deployed or undeployed again.
	unrestored map[string]deployment
	// busy are the uids being deployed or undeployed, which no other
	// deploy or undeploy may take meanwhile.
	busy map[string]bool
	// starting are the share keys whose instance a load is starting,
	// each done when it is, so that other loads of the share key wait to
	// share it, or fail as it did.
	starting map[string]*startRun
	// keeping are the keeps in flight, by owner and digest, under keepMu
	// (they run without mu).
	keepMu  sync.Mutex
	keeping map[string]*keepOp
}

// ownerRuntime is one owner's runtime and how many compiled modules it
// holds.
type ownerRuntime struct {
	rt      *sandbox.Runtime
	owner   string
	modules int
}

// compiledModule is a compiled module and its users: the experts that
// run it, and the loads and validations under way that reserved it. The
// last of them to go closes it.
type compiledModule struct {
	m      *sandbox.Module
	rt     string // its runtime's key
	limits sandbox.Limits
	users  int
	// ready is closed once the compile that made the entry has ended,
	// with m set or err; until then other users wait for it.
	ready chan struct{}
	err   error
}

// newLoader makes a loader; its store and device are set before its
// first load.
func newLoader(cache *sandbox.Cache, limits func(owner string) sandbox.Limits) *loader {
	return &loader{
		cache: cache, limits: limits,
		runtimes: map[string]*ownerRuntime{}, compiled: map[string]*compiledModule{}, slots: map[string]*instanceSlot{},
		unrestored: map[string]deployment{}, busy: map[string]bool{}, starting: map[string]*startRun{},
		keeping: map[string]*keepOp{},
	}
}

// runtimeKey names the runtime of owner with limits.
// ParamBytes is left out: it bounds each expert's parameter store, not
// the runtime, so experts that differ only in it share a runtime.
func runtimeKey(owner string, limits sandbox.Limits) string {
	limits = limits.WithDefaults()
	limits.ParamBytes = 0
	return fmt.Sprintf("%s\x00%+v", owner, limits)
}

// maxRuntimesPerOwner bounds the runtimes of one owner: one per distinct
// set of limits its deployments ask for.
const maxRuntimesPerOwner = 4

// runtime returns the runtime of owner with limits, starting it if
// needed: experts whose deployments ask for other limits than their
// owner's get a runtime of their own. Runtimes live until the server
// stops, even when no module uses them: closing a wazero runtime leaves
// about 80 KB of its host modules' code mapped, so a deploy cycle that
// made and closed one would leak that much each time.
func (l *loader) runtime(ctx context.Context, owner string, limits sandbox.Limits) (*ownerRuntime, string, error) {
	key := runtimeKey(owner, limits)
	if or, ok := l.runtimes[key]; ok {
		return or, key, nil
	}
	n := 0
	for _, or := range l.runtimes {
		if or.owner == owner {
			n++
		}
	}
	if n >= maxRuntimesPerOwner {
		return nil, "", fmt.Errorf("%w: %q already runs experts under %d different sets of limits, the most one owner may", ErrTooManyLimits, owner, n)
	}
	rt, err := sandbox.NewRuntimeWithCache(ctx, l.cache, limits)
	if err != nil {
		return nil, "", err
	}
	or := &ownerRuntime{rt: rt, owner: owner}
	l.runtimes[key] = or
	return or, key, nil
}

// compile returns owner's compiled module of wasm under limits,
// compiling it if needed (fresh is true when this call did), with one use
// reserved for the caller: an expert keeps it, anyone else gives it back
// with release. Call with l.mu held; compile releases it while the module
// compiles, or while it waits for another call compiling the same one.
func (l *loader) compile(ctx context.Context, owner string, limits sandbox.Limits, wasm []byte, digest string) (cm *compiledModule, key string, fresh bool, err error) {
	rtKey := runtimeKey(owner, limits)
	key = rtKey + "\x00" + digest
	if cm, ok := l.compiled[key]; ok {
		cm.users++
		select {
		case <-cm.ready:
			return cm, key, false, nil
		default:
		}
		l.mu.Unlock()
		select {
		case <-cm.ready:
		case <-ctx.Done():
		}
		l.mu.Lock()
		select {
		case <-cm.ready:
			if cm.err != nil {
				// The compiler took the entry out; reservations died with it.
				return nil, "", false, cm.err
			}
			return cm, key, false, nil
		default:
			cm.users-- // the compiler holds a use: nothing closes here
			return nil, "", false, ctx.Err()
		}
	}
	or, rtKey, err := l.runtime(ctx, owner, limits)
	if err != nil {
		return nil, "", false, err
	}
	cm = &compiledModule{rt: rtKey, limits: or.rt.Limits(), users: 1, ready: make(chan struct{})}
	l.compiled[key] = cm
	or.modules++
	l.mu.Unlock()
	m, err := or.rt.Compile(ctx, wasm)
	l.mu.Lock()
	cm.m, cm.err = m, err
	close(cm.ready)
	if err != nil {
		delete(l.compiled, key)
		or.modules--
		return nil, "", false, err
	}
	return cm, key, true, nil
}

// modulePin is a module kept in the store and pinned there for one
// expert, which pinAsync does in the background.
type modulePin struct {
	done    chan struct{}
	release func() // the pin's, once done without err
	err     error
	once    sync.Once
}

// pinAsync keeps wasm (of digest) in the store for owner and pins it
// there, in a goroutine; keeps of one module at a time share one write.
func (l *loader) pinAsync(owner string, wasm []byte, digest string) *modulePin {
	p := &modulePin{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if p.err = l.keepOnce(owner, wasm, digest); p.err == nil {
			p.release, p.err = l.store.Pin(owner, digest)
		}
	}()
	return p
}

// wait returns once the module is kept and pinned, or could not be.
func (p *modulePin) wait() error {
	<-p.done
	return p.err
}

// unpin waits for the pin and releases it; later calls do nothing.
func (p *modulePin) unpin() {
	p.once.Do(func() {
		<-p.done
		if p.release != nil {
			p.release()
		}
	})
}

// keepOnce is keep, shared by the keeps of one owner's module that run at
// once (the experts of one module, loaded side by side).
func (l *loader) keepOnce(owner string, wasm []byte, digest string) error {
	k := owner + "\x00" + digest
	l.keepMu.Lock()
	op, ok := l.keeping[k]
	if !ok {
		op = &keepOp{done: make(chan struct{})}
		l.keeping[k] = op
	}
	l.keepMu.Unlock()
	if ok {
		<-op.done
		return op.err
	}
	op.err = l.keep(owner, wasm, digest)
	l.keepMu.Lock()
	delete(l.keeping, k)
	l.keepMu.Unlock()
	close(op.done)
	return op.err
}

// keepOp is a keep in flight.
type keepOp struct {
	done chan struct{}
	err  error
}

// keep makes sure the module store holds wasm (of the given digest) for
// owner, so that the deployment can be restored by digest: a tenant's
// modules are there already when they came through an upload.
func (l *loader) keep(owner string, wasm []byte, digest string) error {
	if l.store.Has(owner, digest) {
		return nil
	}
	if owner == modules.Operator {
		_, err := l.store.Put(wasm)
		return err
	}
	_, err := l.store.Upload(owner, "", bytes.NewReader(wasm), int64(len(wasm)), modules.Quota{})
	return err
}

// release drops one user of the compiled module under key, closing it
// when it is left unused.
func (l *loader) release(ctx context.Context, key string) error {
	cm, ok := l.compiled[key]
	if !ok {
		return nil
	}
	if cm.users--; cm.users > 0 {
		return nil
	}
	delete(l.compiled, key)
	if or := l.runtimes[cm.rt]; or != nil {
		or.modules--
	}
	return cm.m.Close(ctx)
}

// close closes every runtime; the experts must be closed first.
func (l *loader) close(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for owner, or := range l.runtimes {
		errs = append(errs, or.rt.Close(ctx))
		delete(l.runtimes, owner)
	}
	clear(l.compiled)
	clear(l.slots)
	if l.cache != nil {
		errs = append(errs, l.cache.Close(ctx))
	}
	return errors.Join(errs...)
}

// load makes the expert ec describes, with its parameters drawn (or
// restored from its newest checkpoint) and its pools made, but not yet
// served. fresh is true when its module was compiled for it. Call with
// l.mu held; load releases it while the module compiles and while the
// expert's instance starts.
func (r *Registry) load(ctx context.Context, l *loader, ec Spec) (e *Expert, fresh bool, err error) {
	wasm, err := ec.Module.load(l.store)
	if err != nil {
		return nil, false, fmt.Errorf("loading expert %q: %w", ec.UID, err)
	}
	limits := l.limits(ec.Owner)
	if ec.Limits != nil {
		limits = limits.WithExpert(*ec.Limits)
	}
	// One hash per load: the module cache, the store and the pin all
	// name the module by it.
	digest := modules.Digest(wasm)
	cm, key, fresh, err := l.compile(ctx, ec.Owner, limits, wasm, digest)
	if err != nil {
		return nil, false, fmt.Errorf("loading expert %q from %v: %w", ec.UID, ec.Module, err)
	}
	// The use compile reserved becomes the expert's; until the expert
	// is made, it is given back on failure.
	made := false
	defer func() {
		if err != nil && !made {
			err = errors.Join(err, l.release(context.WithoutCancel(ctx), key))
		}
	}()
	// The module is kept in the store, and pinned there while the expert
	// runs it so that its owner cannot delete it, beside the rest of the
	// load: the first keep of a module waits for the disk.
	pin := l.pinAsync(ec.Owner, wasm, digest)
	defer func() {
		if err != nil {
			pin.unpin()
		}
	}()
	optCfg := r.cfg.Optimizer
	if ec.Optimizer != nil {
		optCfg = *ec.Optimizer
	}
	opt, err := buildOptimizer(optCfg)
	if err != nil {
		return nil, false, err
	}
	// Experts share an instance only on one device: the instance's
	// tensors live there.
	ln := r.pickLane()
	share := cm.rt + "\x00" + shareKey(cm.m.Digest(), ec.Config) + "\x00" + ln.dev.Name()
	paramBytes := limits.WithDefaults().ParamBytes // the expert's own, not its runtime's
	limits = cm.limits
	limits.ParamBytes = paramBytes
	if !r.cfg.ExclusiveInstances {
		// Another load starting the instance that this one would share
		// (Start loads experts side by side) is waited for, so that
		// they share it; if its start failed, this one fails as it did
		// rather than run the same moe_init again (a tenant's module
		// that spins would cost its init timeout once per deploy).
		if err := l.waitStarting(ctx, share); err != nil {
			return nil, false, fmt.Errorf("loading expert %q: the instance it would share failed to start: %w", ec.UID, err)
		}
	}
	if slot, ok := l.slots[share]; ok && !r.cfg.ExclusiveInstances {
		e, err = newSharedExpert(ec.UID, slot, cm.m, ln.dev, ec.Config, opt, limits.ParamBytes)
	} else {
		// A new instance starts and runs moe_init (up to the owner's
		// init timeout) without the lock.
		started := l.beginStarting(share)
		l.mu.Unlock()
		e, err = newExpert(ctx, ec.UID, cm.m, ln.dev, ec.Config, opt, limits.ParamBytes)
		l.mu.Lock()
		if err == nil {
			if _, ok := l.slots[share]; !ok {
				// Another load may have started an instance for share
				// meanwhile; then this one stays the expert's own.
				l.slots[share] = e.guest.slot
			}
		}
		if ctx.Err() != nil {
			started(nil) // this caller gave up: the start says nothing of the next
		} else {
			started(err)
		}
	}
	if err != nil {
		return nil, false, err
	}
	made = true
	e.guest.share, e.guest.compiledKey, e.guest.unpin = share, key, pin.unpin
	e.guest.restores = ec.Module.restores
	e.tenancy.owner, e.tenancy.forward, e.tenancy.backward = ec.Owner, ec.ForwardAccess, ec.BackwardAccess
	e.trainer.configure(optCfg)
	// The expert's parameters are restored or drawn without the lock:
	// nothing else reaches them before it serves, and loads of other
	// experts go on meanwhile.
	l.mu.Unlock()
	err = r.fill(e)
	if err == nil {
		if err = pin.wait(); err != nil {
			err = fmt.Errorf("loading expert %q: %w", ec.UID, err)
		}
	}
	l.mu.Lock()
	if err != nil {
		return nil, false, errors.Join(err, r.unload(context.WithoutCancel(ctx), l, e))
	}
	e.guest.callTimeout = limits.CallTimeout
	e.q = l.quarantineOf(ec.Owner)
	lim := r.cfg.Batching
	if ec.Batching != nil {
		lim = *ec.Batching
	}
	e.attachPools(lim, r.cfg.Metrics, ln.worker.Notify, r.kill)
	return e, fresh, nil
}

// fill gives a new expert its parameters' values: from its newest
// checkpoint that loads, or else its initial values, drawn now, before it
// serves (a restore draws none of them).
func (r *Registry) fill(e *Expert) error {
	if r.ckpt != nil {
		if err := r.ckpt.restore(e); err != nil {
			return err
		}
	}
	if err := e.guest.binding.Params.Draw(); err != nil {
		return fmt.Errorf("loading expert %q: %w", e.uid, err)
	}
	return nil
}

// startRun is a load starting a share key's instance: done closes when it
// ends, and err is then its error, nil if it started or its caller gave
// up.
type startRun struct {
	done chan struct{}
	err  error
}

// beginStarting records that a load is starting share's instance, and
// returns the function that records it done with the start's error (nil
// when the start says nothing of another's: it worked, or its caller gave
// up). Call both with l.mu held.
func (l *loader) beginStarting(share string) (done func(error)) {
	run := &startRun{done: make(chan struct{})}
	if _, ok := l.starting[share]; !ok {
		l.starting[share] = run
	}
	return func(err error) {
		if l.starting[share] == run {
			delete(l.starting, share)
		}
		run.err = err
		close(run.done)
	}
}

// waitStarting waits, with l.mu released, while another load starts
// share's instance, or until ctx ends. It returns the error of a start it
// waited for that failed on its own. Call with l.mu held.
func (l *loader) waitStarting(ctx context.Context, share string) error {
	for {
		run, ok := l.starting[share]
		if !ok {
			return nil
		}
		l.mu.Unlock()
		select {
		case <-run.done:
		case <-ctx.Done():
		}
		l.mu.Lock()
		if ctx.Err() != nil {
			return nil
		}
		if run.err != nil {
			return run.err
		}
	}
}

// unload takes apart what load made: it closes the expert's instance and
// compiled module when no other expert uses them, and deletes its metric
// series. Its pools must be closed and off the worker. Call with l.mu
// held.
func (r *Registry) unload(ctx context.Context, l *loader, e *Expert) error {
	err := e.close(ctx)
	g := &e.guest
	g.unpin()
	if l.slots[g.share] == g.slot && g.slot.idle() {
		delete(l.slots, g.share)
	}
	err = errors.Join(err, l.release(ctx, g.compiledKey))
	r.cfg.Metrics.forget(e.uid)
	return err
}

// Deploy loads ec and serves it while the server runs: a uid that is
// already served is refused (ErrExpertServed). The expert is in
// Info, the DHT's next announcement and /metrics once Deploy returns.
func (r *Registry) Deploy(ctx context.Context, ec Spec) error {
	l, err := r.live()
	if err != nil {
		return err
	}
	if err := ec.Validate(r.ckpt != nil); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, taken := r.Get(ec.UID); taken {
		return fmt.Errorf("%w: %q", ErrExpertServed, ec.UID)
	}
	if l.busy[ec.UID] {
		return fmt.Errorf("expert %q is being deployed or undeployed: %w", ec.UID, ErrExpertServed)
	}
	l.busy[ec.UID] = true
	defer delete(l.busy, ec.UID)
	e, _, err := r.load(ctx, l, ec)
	if err != nil {
		return err
	}
	e.tenancy.deployed = &deployment{
		UID: ec.UID, Owner: ec.Owner, Module: e.guest.digest(), Config: ec.Config,
		Batching: ec.Batching, Optimizer: ec.Optimizer,
		ForwardAccess: ec.ForwardAccess, BackwardAccess: ec.BackwardAccess, Limits: ec.Limits,
	}
	r.put(e)
	delete(l.unrestored, ec.UID)
	// Saved before it serves: a deployment that answered once comes back
	// after a restart.
	if err := r.saveDeployments(l); err != nil {
		r.take(ec.UID)
		e.pools.close(err)
		return errors.Join(err, r.unload(context.WithoutCancel(ctx), l, e))
	}
	r.Schedule(e)
	r.log.Info("expert deployed", "uid", ec.UID, "digest", e.guest.digest(), "owner", e.tenancy.owner)
	return nil
}

// Undeploy stops serving uid: its queued requests fail with Unavailable,
// a batch of it that runs finishes, and then its pools leave the worker,
// its instance and module close unless other experts share them, its
// parameters are dropped and its metric series deleted. Its checkpoints
// stay on disk, so that a later Deploy of the uid resumes from them.
func (r *Registry) Undeploy(ctx context.Context, uid string) error {
	l, err := r.live()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy[uid] {
		return fmt.Errorf("%w: expert %q is being deployed or undeployed; try again", ErrNotRun, uid)
	}
	e, ok := r.take(uid)
	if _, was := l.unrestored[uid]; was && !ok {
		delete(l.unrestored, uid)
		return r.saveDeployments(l)
	}
	if !ok {
		return fmt.Errorf("%w: expert %q is not served", ErrUnknownExpert, uid)
	}
	if e.tenancy.deployed != nil {
		err = r.saveDeployments(l)
	}
	l.busy[uid] = true
	defer delete(l.busy, uid)
	gone := fmt.Errorf("expert %q was undeployed", uid)
	e.pools.close(gone)
	// Remove waits for a batch of the pools that is running, so that
	// nothing uses the instance once it is closed below; other deploys
	// and undeploys go on meanwhile.
	l.mu.Unlock()
	e.pools.unschedule(r.laneOf(e).worker)
	l.mu.Lock()
	err = errors.Join(err, r.unload(ctx, l, e))
	r.log.Info("expert undeployed", "uid", uid)
	return err
}

// Schedule puts e's pools on the device worker, in its owner's group, so
// that tenants share the device fairly (the operator's experts form a
// group of their own).
func (r *Registry) Schedule(e *Expert) {
	var opts []sched.AddOption
	if owner := e.tenancy.owner; owner != "" {
		opts = append(opts, sched.WithGroup("tenant:"+owner, r.cfg.QueueShare(owner)))
	}
	e.pools.schedule(r.laneOf(e).worker, opts...)
}

// forget deletes uid's metric series, so that an undeployed expert leaves
// nothing behind in /metrics.
func (m *Metrics) forget(uid string) {
	l := prometheus.Labels{"expert": uid}
	for _, v := range []*prometheus.MetricVec{
		m.batches.MetricVec, m.failed.MetricVec, m.samples.MetricVec, m.queueDepth.MetricVec,
		m.batchSize.MetricVec, m.queueWait.MetricVec, m.runTime.MetricVec, m.restarts.MetricVec,
		m.saves.MetricVec, m.lastSave.MetricVec,
	} {
		v.DeletePartialMatch(l)
	}
}
