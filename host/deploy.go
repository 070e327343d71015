package host

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/rpc"
	"github.com/moehost/moehost/host/sandbox"
	"github.com/moehost/moehost/modules"
)

// loader turns ExpertConfigs into running experts and takes them apart
// again. Start uses it for the configured experts and Deploy for live
// ones, so that both compile each module digest once and let experts of
// one module and config share an instance. Its maps are guarded by mu,
// which also serialises deploys and undeploys.
type loader struct {
	mu       sync.Mutex
	rt       *sandbox.Runtime
	store    *modules.Store
	dev      gpuhost.Device
	compiled map[string]*compiledModule // by digest
	slots    map[string]*instanceSlot   // by shareKey
}

// compiledModule is a compiled module and the experts that use it; the
// last of them to go closes it.
type compiledModule struct {
	m     *sandbox.Module
	users int
}

func newLoader(rt *sandbox.Runtime, store *modules.Store, dev gpuhost.Device) *loader {
	return &loader{rt: rt, store: store, dev: dev, compiled: map[string]*compiledModule{}, slots: map[string]*instanceSlot{}}
}

// load makes the expert ec describes, with its parameters drawn (or
// restored from its newest checkpoint) and its pools made, but not yet
// served. fresh is true when its module was compiled for it. Call with
// l.mu held.
func (s *Server) load(ctx context.Context, l *loader, ec ExpertConfig) (e *expert, fresh bool, err error) {
	wasm, err := ec.Module.load(l.store)
	if err != nil {
		return nil, false, fmt.Errorf("loading expert %q: %w", ec.UID, err)
	}
	key := modules.Digest(wasm)
	cm, ok := l.compiled[key]
	if !ok {
		m, err := l.rt.Compile(ctx, wasm)
		if err != nil {
			return nil, false, fmt.Errorf("loading expert %q from %v: %w", ec.UID, ec.Module, err)
		}
		if _, err := l.store.Put(wasm); err != nil {
			return nil, false, errors.Join(fmt.Errorf("loading expert %q: %w", ec.UID, err), m.Close(ctx))
		}
		cm, fresh = &compiledModule{m: m}, true
		l.compiled[key] = cm
	}
	// Until the expert is made, a module compiled for it alone goes again.
	defer func() {
		if err != nil && cm.users == 0 {
			delete(l.compiled, key)
			err = errors.Join(err, cm.m.Close(context.WithoutCancel(ctx)))
		}
	}()
	optCfg := s.cfg.optimizer
	if ec.Optimizer != nil {
		optCfg = *ec.Optimizer
	}
	opt, err := optCfg.build()
	if err != nil {
		return nil, false, err
	}
	share := shareKey(cm.m.Digest(), ec.Config)
	if slot, ok := l.slots[share]; ok && !s.cfg.exclusiveInstances {
		e, err = newSharedExpert(ec.UID, slot, cm.m, l.dev, ec.Config, opt, l.rt.Limits().ParamBytes)
	} else {
		e, err = newExpert(ctx, ec.UID, cm.m, l.dev, ec.Config, opt, l.rt.Limits().ParamBytes)
	}
	if err != nil {
		return nil, false, err
	}
	cm.users++
	l.slots[share] = e.slot
	e.share, e.owner = share, ec.Owner
	e.optCfg, e.optJSON = optCfg, optimizerJSON(optCfg)
	if s.ckpt != nil {
		if err := s.ckpt.restore(e); err != nil {
			return nil, false, errors.Join(err, s.unload(context.WithoutCancel(ctx), l, e))
		}
	}
	e.callTimeout = l.rt.Limits().CallTimeout
	lim := s.cfg.batching
	if ec.Batching != nil {
		lim = *ec.Batching
	}
	e.attachPools(lim, s.metrics, s.worker.Notify)
	return e, fresh, nil
}

// unload takes apart what load made: it closes the expert's instance and
// compiled module when no other expert uses them, and deletes its metric
// series. Its pools must be closed and off the worker. Call with l.mu
// held.
func (s *Server) unload(ctx context.Context, l *loader, e *expert) error {
	err := e.close(ctx)
	if l.slots[e.share] == e.slot && e.slot.idle() {
		delete(l.slots, e.share)
	}
	digest := e.module.Digest()
	if cm, ok := l.compiled[digest]; ok {
		if cm.users--; cm.users == 0 {
			delete(l.compiled, digest)
			err = errors.Join(err, cm.m.Close(ctx))
		}
	}
	s.metrics.forget(e.uid)
	return err
}

// Deploy loads ec and serves it while the server runs: a uid that is
// already served is refused (rpc.ErrAlreadyExists). The expert is in
// Info, the DHT's next announcement and /metrics once Deploy returns.
func (s *Server) Deploy(ctx context.Context, ec ExpertConfig) error {
	l, err := s.liveLoader()
	if err != nil {
		return err
	}
	if err := ec.validate(s.ckpt != nil); err != nil {
		return fmt.Errorf("%w: %w", rpc.ErrInvalidArgument, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.mu.Lock()
	_, taken := s.experts[ec.UID]
	s.mu.Unlock()
	if taken {
		return fmt.Errorf("%w: expert %q is already served", rpc.ErrAlreadyExists, ec.UID)
	}
	e, _, err := s.load(ctx, l, ec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.experts[ec.UID] = e
	s.sorted = sortedExperts(s.experts)
	s.mu.Unlock()
	s.worker.Add(e.fwd)
	s.worker.Add(e.bwd)
	s.log.Info("expert deployed", "uid", ec.UID, "digest", e.module.Digest(), "owner", e.owner)
	return nil
}

// Undeploy stops serving uid: its queued requests fail with Unavailable,
// a batch of it that runs finishes, and then its pools leave the worker,
// its instance and module close unless other experts share them, its
// parameters are dropped and its metric series deleted. Its checkpoints
// stay on disk, so that a later Deploy of the uid resumes from them.
func (s *Server) Undeploy(ctx context.Context, uid string) error {
	l, err := s.liveLoader()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.mu.Lock()
	e, ok := s.experts[uid]
	if ok {
		delete(s.experts, uid)
		s.sorted = sortedExperts(s.experts)
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: expert %q is not served", rpc.ErrNotFound, uid)
	}
	gone := fmt.Errorf("expert %q was undeployed", uid)
	e.fwd.Close(gone)
	e.bwd.Close(gone)
	// Remove waits for a batch of the pools that is running, so that
	// nothing uses the instance once it is closed below.
	s.worker.Remove(e.fwd)
	s.worker.Remove(e.bwd)
	err = s.unload(ctx, l, e)
	s.log.Info("expert undeployed", "uid", uid)
	return err
}

// liveLoader returns the running server's loader.
func (s *Server) liveLoader() (*loader, error) {
	select {
	case <-s.done:
		return nil, fmt.Errorf("%w: %w", rpc.ErrUnavailable, errShuttingDown)
	case <-s.ready:
	default:
		return nil, fmt.Errorf("%w: the server is not running", rpc.ErrUnavailable)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loader, nil
}

// sortedExperts lists experts by uid, for rpc.Experts.All.
func sortedExperts(experts map[string]*expert) []rpc.Expert {
	sorted := make([]rpc.Expert, 0, len(experts))
	for _, uid := range slices.Sorted(maps.Keys(experts)) {
		sorted = append(sorted, experts[uid])
	}
	return sorted
}

// forget deletes uid's metric series, so that an undeployed expert leaves
// nothing behind in /metrics.
func (m *metrics) forget(uid string) {
	l := prometheus.Labels{"expert": uid}
	for _, v := range []*prometheus.MetricVec{
		m.batches.MetricVec, m.failed.MetricVec, m.samples.MetricVec, m.queueDepth.MetricVec,
		m.batchSize.MetricVec, m.queueWait.MetricVec, m.runTime.MetricVec, m.restarts.MetricVec,
	} {
		v.DeletePartialMatch(l)
	}
}
