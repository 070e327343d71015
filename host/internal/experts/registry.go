// Package experts is the expert lifecycle: it turns expert specs into
// running experts (the loader: one wazero runtime per owner and limits,
// one compile per module digest, instances shared by experts of one module
// and config), serves them through their batch pools on the devices'
// workers, deploys and undeploys them live, keeps the deployments file,
// and saves and restores their checkpoints. Its Registry is the one place
// that knows which experts run; the server (package host) wires it to the
// wire rooms through thin adapters.
//
// Its errors are its own sentinels (errors.go); host maps them to wire
// codes in its one table.
package experts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/modules"
)

// Config is what the registry takes from the server's options.
type Config struct {
	// Log gets the lifecycle's lines (deploys, restores, saves).
	Log *slog.Logger
	// DataDir holds the deployments file.
	DataDir string
	// Optimizer is the optimizer of an expert whose spec names none.
	Optimizer gpuhost.OptimizerConfig
	// Batching are the batch limits of an expert whose spec sets none.
	Batching batch.Limits
	// Limits are the server's guest limits; they bound checkpoint files.
	Limits sandbox.Limits
	// OwnerLimits gives an owner's guest limits, before an expert's own.
	OwnerLimits func(owner string) sandbox.Limits
	// QueueShare gives a tenant's weight on the device worker.
	QueueShare func(owner string) float64
	// HasTenant reports whether an owner is a tenant of the server; nil
	// when the server has no tenants (every owner then may restore).
	HasTenant func(owner string) bool
	// ExclusiveInstances gives every expert its own instance.
	ExclusiveInstances bool
	// Checkpoints, when not nil, are saved and restored (Dir and Keep
	// resolved).
	Checkpoints *CheckpointConfig
	// Metrics get the experts' series.
	Metrics *Metrics
}

// Registry holds the running experts and everything that makes and takes
// them apart.
type Registry struct {
	cfg Config
	log *slog.Logger

	// served is set by Serve, and stopped by Refuse or Stop: Deploy and
	// Undeploy work in between.
	served, stopped atomic.Bool

	mu      sync.Mutex
	lanes   []*lane
	experts map[string]*Expert
	sorted  []*Expert // experts by uid, replaced (never changed) on each change
	loader  *loader
	ckpt    *checkpointer // nil without checkpoints

	stopSave, saveDone chan struct{} // the periodic saver's
	devicesClosed      bool

	// kill ends every guest call at once (sandbox.WithKill): Stop
	// cancels it when its drain is over.
	kill       context.Context
	killGuests context.CancelFunc
}

// errShuttingDown fails what is queued when the server stops.
var errShuttingDown = errors.New("server is shutting down")

// New makes a registry; Open readies it.
func New(cfg Config) *Registry {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.OwnerLimits == nil {
		lim := cfg.Limits.WithDefaults()
		cfg.OwnerLimits = func(string) sandbox.Limits { return lim }
	}
	if cfg.QueueShare == nil {
		cfg.QueueShare = func(string) float64 { return 1 }
	}
	kill, killGuests := context.WithCancel(context.Background())
	return &Registry{cfg: cfg, log: cfg.Log, experts: map[string]*Expert{}, kill: kill, killGuests: killGuests}
}

// Open gives the registry its compilation cache, module store and
// devices (one worker each), and opens the checkpoint store.
func (r *Registry) Open(cache *sandbox.Cache, store *modules.Store, devs []gpuhost.Device) error {
	l := newLoader(cache, r.cfg.OwnerLimits)
	l.store = store
	var c *checkpointer
	if r.cfg.Checkpoints != nil {
		var err error
		if c, err = openCheckpointer(*r.cfg.Checkpoints, r); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loader, r.ckpt, r.lanes = l, c, makeLanes(devs)
	return nil
}

// Serve marks the registry as serving: Deploy and Undeploy work from now
// on, and Stop saves what trained.
func (r *Registry) Serve() { r.served.Store(true) }

// Refuse refuses Deploy and Undeploy from now on, as the server begins
// to shut down.
func (r *Registry) Refuse() { r.stopped.Store(true) }

// live returns the loader of a serving registry.
func (r *Registry) live() (*loader, error) {
	switch {
	case r.stopped.Load():
		return nil, fmt.Errorf("%w: %w", ErrNotRun, errShuttingDown)
	case !r.served.Load():
		return nil, fmt.Errorf("%w: the server is not running", ErrNotRun)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loader, nil
}

// Get returns the expert uid.
func (r *Registry) Get(uid string) (*Expert, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.experts[uid]
	return e, ok
}

// Running returns the expert uid, or ErrUnknownExpert.
func (r *Registry) Running(uid string) (*Expert, error) {
	if e, ok := r.Get(uid); ok {
		return e, nil
	}
	return nil, fmt.Errorf("%w: no expert %q on this server", ErrUnknownExpert, uid)
}

// All returns the experts in uid order. The slice is replaced, never
// changed, when an expert is deployed or undeployed, so that the caller
// may read it without a lock; it must not change it.
func (r *Registry) All() []*Expert {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sorted
}

// OwnedBy returns the experts that owner owns, in uid order.
func (r *Registry) OwnedBy(owner string) []*Expert {
	var out []*Expert
	for _, e := range r.All() {
		if e.tenancy.owner == owner {
			out = append(out, e)
		}
	}
	return out
}

// put adds or replaces e. Call without r.mu.
func (r *Registry) put(e *Expert) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.experts[e.uid] = e
	r.sorted = sortedExperts(r.experts)
}

// take removes uid and returns it.
func (r *Registry) take(uid string) (*Expert, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.experts[uid]
	if ok {
		delete(r.experts, uid)
		r.sorted = sortedExperts(r.experts)
	}
	return e, ok
}

// sortedExperts lists experts by uid.
func sortedExperts(experts map[string]*Expert) []*Expert {
	sorted := make([]*Expert, 0, len(experts))
	for _, uid := range slices.Sorted(maps.Keys(experts)) {
		sorted = append(sorted, experts[uid])
	}
	return sorted
}

// Stop fails what is queued and refuses what comes, stops the periodic
// saver and the workers (letting running batches end for up to drain,
// then cancelling them), and saves every expert that trained since its
// last save when the registry was serving, within ctx.
func (r *Registry) Stop(ctx context.Context, drain time.Duration) {
	r.Refuse()
	experts := r.All()
	for _, e := range experts {
		e.pools.close(errShuttingDown)
	}
	r.stopSaving()
	// Past the drain, the workers cancel their batches, which stops a
	// guest between ops; one that spins in guest code is killed.
	wctx, cancel := context.WithTimeout(ctx, drain)
	stopKill := context.AfterFunc(wctx, r.killGuests)
	r.closeWorkers(wctx)
	stopKill()
	cancel()
	r.mu.Lock()
	c := r.ckpt
	r.mu.Unlock()
	if c != nil && r.served.Load() {
		c.saveAll(ctx, experts, false)
	}
}

// Close releases every expert's instance and the loader's runtimes;
// Stop must have run. The devices are the caller's to close.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	experts := slices.Collect(maps.Values(r.experts))
	l := r.loader
	r.mu.Unlock()
	var errs []error
	for _, e := range experts {
		errs = append(errs, e.close(ctx))
	}
	if l != nil {
		errs = append(errs, l.close(ctx))
	}
	return errors.Join(errs...)
}

// CloseDevices hands the devices to closeFn once: they stay listed, so
// that memory stats read after Close.
func (r *Registry) CloseDevices(closeFn func([]gpuhost.Device) error) error {
	r.mu.Lock()
	devs, closed := r.devicesLocked(), r.devicesClosed
	r.devicesClosed = true
	r.mu.Unlock()
	if closed {
		return nil
	}
	return closeFn(devs)
}

// ExpertTotals are one expert's running totals, its forward and backward
// pools summed.
type ExpertTotals struct {
	Expert *Expert
	PoolTotals
}

// LoadTotals appends every expert's running totals to dst, in uid order,
// and returns it, for the dashboard's load history; each pool's longest
// wait restarts. It allocates nothing when dst has room.
func (r *Registry) LoadTotals(dst []ExpertTotals) []ExpertTotals {
	for _, e := range r.All() {
		sum := ExpertTotals{Expert: e}
		for _, p := range [...]*poolStats{e.pools.fwdStats, e.pools.bwdStats} {
			if p == nil {
				continue
			}
			t := p.tick()
			sum.Batches += t.Batches
			sum.Samples += t.Samples
			sum.Run += t.Run
			sum.Depth += t.Depth
			sum.WaitMax = max(sum.WaitMax, t.WaitMax)
		}
		dst = append(dst, sum)
	}
	return dst
}

// LiveStore returns the module store of a serving registry, or ErrNotRun.
func (r *Registry) LiveStore() (*modules.Store, error) {
	l, err := r.live()
	if err != nil {
		return nil, err
	}
	return l.store, nil
}
