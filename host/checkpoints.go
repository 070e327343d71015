package host

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// ErrCheckpointMismatch is returned by Start (and Restore) for a
// checkpoint that belongs to another module or other parameter shapes.
var ErrCheckpointMismatch = errors.New("checkpoint does not match the expert")

// snapshot is an expert's training state, copied off the device.
type snapshot = checkpoint.Checkpoint

// takeSnapshot copies e's parameters, optimizer state and counters, and
// returns the count of updates they reflect. It holds e.guest.slot.mu,
// so it sees the state between two batches; called on the device worker
// (or once it has stopped), it waits for nothing.
func (e *expert) takeSnapshot() (*snapshot, int64, error) {
	e.guest.slot.mu.Lock()
	defer e.guest.slot.mu.Unlock()
	s, err := e.snapshotLocked()
	return s, e.trainer.updates.Load(), err
}

func (e *expert) snapshotLocked() (*snapshot, error) {
	st, err := e.trainer.opt.State()
	if err != nil {
		return nil, fmt.Errorf("snapshot of %q: %w", e.uid, err)
	}
	ps := e.guest.binding.Params.Params()
	s := &snapshot{Meta: checkpoint.Meta{
		UID:          e.uid,
		ModuleDigest: e.guest.digest(),
		Step:         st.Steps,
		Examples:     e.stats.backwardExamples.Load(),
		Config:       e.guest.binding.Config,
		Optimizer:    e.trainer.json,
	}}
	dev := e.Device()
	for _, p := range ps {
		vals, err := dev.Float32s(p.Tensor)
		if err != nil {
			return nil, fmt.Errorf("snapshot of %q: param %q: %w", e.uid, p.Name, err)
		}
		s.Params = append(s.Params, checkpoint.Tensor{Name: p.Name, Shape: slices.Clone(p.Tensor.Shape()), Data: vals})
	}
	for _, slot := range slices.Sorted(maps.Keys(st.Slots)) {
		for i, vals := range st.Slots[slot] {
			s.Optim = append(s.Optim, checkpoint.Tensor{Name: ps[i].Name + "." + slot, Shape: slices.Clone(ps[i].Tensor.Shape()), Data: vals})
		}
	}
	return s, nil
}

// restoreFrom loads c into e: parameters in place, optimizer state and
// counters. It checks every parameter's name and shape first, then the
// module digest and config (unless allowChange), and changes nothing on a
// mismatch.
// An optimizer state that does not fit the optimizer now configured (it
// was changed) is dropped with a warning, keeping the step count.
//
// With lazy nil, c holds the parameters' values, and they are copied
// over the expert's: a restore of a serving expert, between its batches.
// With lazy (whose Checkpoint c is), an expert that serves nothing yet
// (and that nothing else reaches, so no lock is taken) has its parameters
// read straight from the file into their tensors, in place of their
// initial values, which are then never drawn; when a read fails
// (errCheckpointRead), every parameter gets its initial values again and
// nothing else changes.
func (e *expert) restoreFrom(c *snapshot, lazy *checkpoint.Lazy, allowChange bool, warn func(msg string, args ...any)) error {
	if lazy == nil {
		// A serving expert's batches hold the slot: restore between
		// them. One that serves nothing yet is nobody else's, and the
		// experts it may share the slot with go on.
		e.guest.slot.mu.Lock()
		defer e.guest.slot.mu.Unlock()
	}
	store := e.guest.binding.Params
	ps := store.Declared() // a lazy restore leaves the draws undone
	if lazy == nil {
		ps = store.Params()
	}
	if err := paramsMatch(c, ps); err != nil {
		return err
	}
	if !allowChange {
		// The shapes match, so --allow-module-change can help here.
		if c.ModuleDigest != e.guest.digest() && !slices.Contains(e.guest.restores, c.ModuleDigest) {
			return fmt.Errorf("%w: %w: %q step %d was saved by module %s, but the expert runs %s; the parameters' names and shapes match, so a rebuilt module may restore it with --allow-module-change",
				ErrCheckpointMismatch, errCheckpointShapesMatch, e.uid, c.Step, c.ModuleDigest, e.guest.digest())
		}
		if c.Config != nil && !maps.Equal(c.Config, e.guest.binding.Config) {
			return fmt.Errorf("%w: %w: %q step %d was saved with config %s, but the expert runs with %s; the parameters' names and shapes match, so --allow-module-change restores it anyway",
				ErrCheckpointMismatch, errCheckpointShapesMatch, e.uid, c.Step, configString(c.Config), configString(e.guest.binding.Config))
		}
	}
	byName := map[string]int{}
	for i, t := range c.Params {
		byName[t.Name] = i
	}
	tensors := make([]*gpuhost.Tensor, len(ps))
	st := gpuhost.OptimizerState{Steps: c.Step, Slots: map[string][][]float32{}}
	for i, p := range ps {
		tensors[i] = p.Tensor
	}
	index := map[string]int{}
	for i, p := range ps {
		index[p.Name] = i
	}
	optOK := true
	for _, t := range c.Optim {
		cut := strings.LastIndexByte(t.Name, '.')
		i, ok := index[t.Name[:max(cut, 0)]]
		if cut < 0 || !ok {
			optOK = false
			break
		}
		slot := t.Name[cut+1:]
		if st.Slots[slot] == nil {
			st.Slots[slot] = make([][]float32, len(ps))
		}
		st.Slots[slot][i] = t.Data
	}
	opt, err := buildOptimizer(e.trainer.cfg)
	if err != nil {
		return err
	}
	if optOK {
		err = opt.SetState(tensors, st)
	}
	if !optOK || err != nil {
		warn("checkpoint's optimizer state does not fit the configured optimizer; starting its buffers afresh", "uid", e.uid, "step", c.Step, "err", err)
		if err := opt.SetState(tensors, gpuhost.OptimizerState{Steps: c.Step}); err != nil {
			return fmt.Errorf("restoring %q: %w", e.uid, err)
		}
	}
	for i, p := range ps {
		j := byName[p.Name]
		if lazy == nil {
			if err := gpuhost.Assign(p.Tensor, c.Params[j].Data); err != nil {
				return fmt.Errorf("restoring %q: param %d: %w", e.uid, i, err)
			}
			continue
		}
		if err := store.Set(i, func(dst []float32) error { return lazy.ReadParam(j, dst) }); err != nil {
			store.Reinit()
			return fmt.Errorf("%w: restoring %q: %w", errCheckpointRead, e.uid, err)
		}
	}
	e.trainer.opt = opt
	e.trainer.updates.Add(1)
	e.stats.restored(c.Step, c.Examples)
	return nil
}

// errCheckpointShapesMatch marks a mismatch of digest or config only,
// which --allow-module-change can override.
var errCheckpointShapesMatch = errors.New("same parameter shapes")

// errCheckpointRead marks a checkpoint whose parameters could not be read
// from its file after its headers checked out (an I/O error, a file cut
// short meanwhile): a checkpoint that does not load, like a corrupt one.
var errCheckpointRead = errors.New("reading the checkpoint's parameters")

// paramsMatch checks that c holds exactly the parameters ps, by name and
// shape.
func paramsMatch(c *snapshot, ps []sandbox.Param) error {
	byName := map[string]checkpoint.Tensor{}
	for _, t := range c.Params {
		byName[t.Name] = t
	}
	for _, p := range ps {
		t, ok := byName[p.Name]
		if !ok {
			return fmt.Errorf("%w: %q step %d has no parameter %q", ErrCheckpointMismatch, c.UID, c.Step, p.Name)
		}
		if !slices.Equal(t.Shape, p.Tensor.Shape()) {
			return fmt.Errorf("%w: %q step %d: parameter %q is %v in the checkpoint but %v in the module", ErrCheckpointMismatch, c.UID, c.Step, p.Name, t.Shape, p.Tensor.Shape())
		}
		delete(byName, p.Name)
	}
	if len(byName) > 0 {
		extra := slices.Sorted(maps.Keys(byName))
		return fmt.Errorf("%w: %q step %d has parameters the module does not declare: %s", ErrCheckpointMismatch, c.UID, c.Step, strings.Join(extra, ", "))
	}
	return nil
}

// checkpointer saves and restores the experts of a server.
type checkpointer struct {
	store *checkpoint.Store
	cfg   CheckpointConfig
	srv   *Server

	mu    sync.Mutex       // serialises writes
	saved map[string]int64 // last step written, by uid
	// savedAt is each expert's trainer.updates when its state was last
	// written or restored: while they match, a save has nothing to do.
	savedAt map[string]int64
}

// restore loads the newest checkpoint of e that validates. A corrupt one
// is skipped with a warning; a mismatch (digest, shapes) is an error.
func (c *checkpointer) restore(e *expert) error {
	infos, err := c.store.List(e.uid)
	if err != nil {
		return err
	}
	// Each file is at most the expert's parameters (or their optimizer
	// buffers, two per parameter) plus a header.
	for _, in := range infos {
		// The parameters go straight from the file into their tensors,
		// whose initial values are then never drawn.
		ck, err := c.store.Open(e.uid, in.Step, c.maxBytes())
		if err != nil {
			c.srv.log.Warn("skipping a checkpoint that does not load", "uid", e.uid, "step", in.Step, "err", err)
			continue
		}
		err = e.restoreFrom(&ck.Checkpoint, ck, c.cfg.AllowModuleChange, c.srv.log.Warn)
		ck.Close()
		if errors.Is(err, errCheckpointRead) {
			c.srv.log.Warn("skipping a checkpoint that does not load", "uid", e.uid, "step", in.Step, "err", err)
			continue
		}
		if err != nil {
			if errors.Is(err, ErrCheckpointMismatch) {
				// Name the ways out that work: the checkpoints belong to
				// another module or config, and are left alone.
				err = fmt.Errorf("%w; its checkpoints in %s belong to another module or config and were left untouched: serve from another --data-dir, run with --no-checkpoints, or remove them (rm -r %s)",
					err, c.store.Dir(e.uid), c.store.Dir(e.uid))
			}
			return err
		}
		c.mu.Lock()
		c.saved[e.uid] = ck.Step
		c.savedAt[e.uid] = e.trainer.updates.Load() // nothing else runs it yet
		c.mu.Unlock()
		c.srv.log.Info("restored checkpoint", "uid", e.uid, "step", ck.Step, "examples", ck.Examples)
		return nil
	}
	return nil
}

// maxBytes bounds a checkpoint file: the expert's parameters (or their
// optimizer buffers, two per parameter) plus a header.
func (c *checkpointer) maxBytes() int64 {
	pb := c.srv.cfg.limits.WithDefaults().ParamBytes
	if pb <= 0 {
		return 0
	}
	return 2*pb + 1<<20
}

// save snapshots e on the device worker (or directly when onWorker is
// false, once the worker has stopped) and writes it, unless its step was
// saved already and force is false. It returns the step written.
func (c *checkpointer) save(ctx context.Context, e *expert, onWorker, force bool) (int64, bool, error) {
	if !force {
		// Nothing stepped or restored since the last write or restore:
		// the files hold this state already, and copying it (134 MB for
		// make run's experts) would show only that.
		c.mu.Lock()
		last, ok := c.saved[e.uid]
		at, okAt := c.savedAt[e.uid]
		c.mu.Unlock()
		if ok && okAt && at == e.trainer.updates.Load() {
			return last, false, nil
		}
	}
	var (
		snap    *snapshot
		gen     int64
		snapErr error
	)
	if onWorker {
		if err := c.srv.laneOf(e).tasks.run(ctx, func() { snap, gen, snapErr = e.takeSnapshot() }); err != nil {
			return 0, false, err
		}
	} else {
		snap, gen, snapErr = e.takeSnapshot()
	}
	if snapErr != nil {
		return 0, false, snapErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.saved[e.uid]; ok && last == snap.Step && !force {
		c.savedAt[e.uid] = gen
		return snap.Step, false, nil
	}
	if err := c.store.Save(snap); err != nil {
		return 0, false, err
	}
	c.saved[e.uid] = snap.Step
	c.savedAt[e.uid] = gen
	return snap.Step, true, nil
}

// saveAll saves every expert whose step changed; errors are logged.
func (c *checkpointer) saveAll(ctx context.Context, experts []*expert, onWorker bool) {
	for _, e := range experts {
		step, wrote, err := c.save(ctx, e, onWorker, false)
		switch {
		case err != nil:
			c.srv.log.Error("saving checkpoint", "uid", e.uid, "err", err)
		case wrote:
			c.srv.log.Debug("saved checkpoint", "uid", e.uid, "step", step)
		}
	}
}

// loop saves every period until stop is closed.
func (c *checkpointer) loop(stop <-chan struct{}, period time.Duration, experts func() []*expert) {
	t := time.NewTicker(period)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			c.saveAll(ctx, experts(), true)
		}
	}
}

// taskPool runs functions on the device worker between batches, oldest
// first, as a pool of its own among the experts' pools.
type taskPool struct {
	notify func()
	mu     sync.Mutex
	tasks  []task
}

type task struct {
	at   time.Time
	fn   func()
	done chan struct{}
}

func (p *taskPool) Poll() (oldest, readyAt time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tasks) == 0 {
		return time.Time{}, time.Time{}, false
	}
	return p.tasks[0].at, p.tasks[0].at, true
}

func (p *taskPool) RunBatch(context.Context) {
	p.mu.Lock()
	if len(p.tasks) == 0 {
		p.mu.Unlock()
		return
	}
	t := p.tasks[0]
	p.tasks = p.tasks[1:]
	p.mu.Unlock()
	t.fn()
	close(t.done)
}

// run queues fn and waits until the worker has run it, or ctx ends (then
// fn may still run later, so it must only write what the caller reads
// after a nil return).
func (p *taskPool) run(ctx context.Context, fn func()) error {
	t := task{at: time.Now(), fn: fn, done: make(chan struct{})}
	p.mu.Lock()
	p.tasks = append(p.tasks, t)
	p.mu.Unlock()
	p.notify()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the device worker: %w", ErrNotRun, ctx.Err())
	}
}

// optimizerJSON records the optimizer settings in checkpoints' metadata.
func optimizerJSON(o OptimizerConfig) string {
	b, _ := json.Marshal(o.WithDefaults())
	return string(b)
}

// openCheckpoints opens the checkpoint store when WithCheckpoints asked
// for one, and adds its task pool to the device worker.
func (s *Server) openCheckpoints() (*checkpointer, error) {
	if s.cfg.checkpoints == nil {
		return nil, nil
	}
	cfg := *s.cfg.checkpoints
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(s.cfg.dataDir, "checkpoints")
	}
	if cfg.Keep == 0 {
		cfg.Keep = 3
	}
	store, err := checkpoint.Open(cfg.Dir, cfg.Keep)
	if err != nil {
		return nil, err
	}
	c := &checkpointer{store: store, cfg: cfg, srv: s, saved: map[string]int64{}, savedAt: map[string]int64{}}
	s.mu.Lock()
	s.ckpt = c
	s.mu.Unlock()
	return c, nil
}

// startSaving starts the periodic saver.
func (s *Server) startSaving() {
	if s.ckpt == nil {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	s.stopSave, s.saveDone = stop, done
	s.mu.Unlock()
	go func() {
		defer close(done)
		s.ckpt.loop(stop, s.cfg.updatePeriod, s.expertList)
	}()
}

// stopSaving stops the periodic saver, if it runs, and waits for it.
func (s *Server) stopSaving() {
	s.mu.Lock()
	stop, done := s.stopSave, s.saveDone
	s.stopSave = nil
	s.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
}

// saveOnShutdown saves every expert that trained since its last save,
// once the worker has stopped. Only a server that was serving saves: a
// failed Start has nothing new.
func (s *Server) saveOnShutdown(ctx context.Context, experts []*expert) {
	s.mu.Lock()
	c := s.ckpt
	s.mu.Unlock()
	select {
	case <-s.ready:
	default:
		return
	}
	if c != nil {
		c.saveAll(ctx, experts, false)
	}
}

// expertList returns the experts in uid order.
func (s *Server) expertList() []*expert {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*expert, 0, len(s.sorted))
	for _, e := range s.sorted {
		out = append(out, e.(*expert))
	}
	return out
}

// ckptService is the server's CheckpointService backend.
type ckptService Server

// expert returns the expert uid if the request's caller may reach its
// checkpoints: the operator any, a tenant its own.
func (cs *ckptService) expert(ctx context.Context, uid string) (*expert, error) {
	t := (*table)(cs)
	e, ok := t.Expert(uid)
	if !ok {
		return nil, fmt.Errorf("%w: no expert %q on this server", ErrUnknownExpert, uid)
	}
	c := rpc.CallerFrom(ctx)
	if !c.Operator && (c.Tenant == "" || e.(*expert).tenancy.owner != c.Tenant) {
		return nil, fmt.Errorf("expert %q %w: a tenant's token reaches its own experts' checkpoints only", uid, ErrNotYours)
	}
	return e.(*expert), nil
}

func (cs *ckptService) checkpointer() (*checkpointer, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.ckpt == nil {
		return nil, ErrCheckpointsOff
	}
	return cs.ckpt, nil
}

func infoPB(in checkpoint.Info) *moehostv1.CheckpointInfo {
	return &moehostv1.CheckpointInfo{Uid: in.UID, Step: in.Step, SizeBytes: in.Bytes, CreateTime: timestamppb.New(in.Time)}
}

func (cs *ckptService) find(c *checkpointer, uid string, step int64) (*moehostv1.CheckpointInfo, error) {
	infos, err := c.store.List(uid)
	if err != nil {
		return nil, err
	}
	for _, in := range infos {
		if in.Step == step {
			return infoPB(in), nil
		}
	}
	return &moehostv1.CheckpointInfo{Uid: uid, Step: step}, nil
}

func (cs *ckptService) Save(ctx context.Context, uid string) (*moehostv1.CheckpointInfo, error) {
	e, err := cs.expert(ctx, uid)
	if err != nil {
		return nil, err
	}
	c, err := cs.checkpointer()
	if err != nil {
		return nil, err
	}
	step, _, err := c.save(ctx, e, true, true)
	if err != nil {
		return nil, err
	}
	return cs.find(c, uid, step)
}

func (cs *ckptService) List(ctx context.Context, uid string) ([]*moehostv1.CheckpointInfo, error) {
	if _, err := cs.expert(ctx, uid); err != nil {
		return nil, err
	}
	c, err := cs.checkpointer()
	if err != nil {
		return nil, err
	}
	infos, err := c.store.List(uid)
	if err != nil {
		return nil, err
	}
	out := make([]*moehostv1.CheckpointInfo, len(infos))
	for i, in := range infos {
		out[i] = infoPB(in)
	}
	return out, nil
}

func (cs *ckptService) Restore(ctx context.Context, uid string, step *int64) (*moehostv1.CheckpointInfo, error) {
	e, err := cs.expert(ctx, uid)
	if err != nil {
		return nil, err
	}
	c, err := cs.checkpointer()
	if err != nil {
		return nil, err
	}
	infos, err := c.store.List(uid)
	if err != nil {
		return nil, err
	}
	var pick *checkpoint.Info
	for i, in := range infos {
		if step == nil || in.Step == *step {
			pick = &infos[i]
			break
		}
	}
	if pick == nil {
		if step == nil {
			return nil, fmt.Errorf("%w: expert %q has none", checkpoint.ErrNotFound, uid)
		}
		return nil, fmt.Errorf("%w: expert %q has none at step %d", checkpoint.ErrNotFound, uid, *step)
	}
	ck, err := c.store.Load(uid, pick.Step, c.maxBytes())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCheckpointUnreadable, err)
	}
	var restoreErr error
	if err := c.srv.laneOf(e).tasks.run(ctx, func() { restoreErr = e.restoreFrom(ck, nil, c.cfg.AllowModuleChange, cs.log.Warn) }); err != nil {
		return nil, err
	}
	if restoreErr != nil {
		return nil, restoreErr
	}
	c.mu.Lock()
	c.saved[uid] = ck.Step
	c.mu.Unlock()
	cs.log.Info("restored checkpoint on request", "uid", uid, "step", ck.Step)
	return infoPB(*pick), nil
}

func (cs *ckptService) Parameters(ctx context.Context, uid string) (int64, []*moehostv1.NamedTensor, error) {
	e, err := cs.expert(ctx, uid)
	if err != nil {
		return 0, nil, err
	}
	var (
		snap    *snapshot
		snapErr error
	)
	if err := (*Server)(cs).laneOf(e).tasks.run(ctx, func() { snap, _, snapErr = e.takeSnapshot() }); err != nil {
		return 0, nil, err
	}
	if snapErr != nil {
		return 0, nil, snapErr
	}
	out := make([]*moehostv1.NamedTensor, len(snap.Params))
	for i, p := range snap.Params {
		shape := make([]int64, len(p.Shape))
		for j, d := range p.Shape {
			shape[j] = int64(d)
		}
		data := make([]byte, 0, 4*len(p.Data))
		for _, v := range p.Data {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
		}
		out[i] = &moehostv1.NamedTensor{Name: p.Name, Tensor: &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: shape, Data: data}}
	}
	return snap.Step, out, nil
}

// checkpointHandler mounts the CheckpointService when someone can use
// it: with tenants, each for its own experts; with an admin token, its
// bearer; with neither, loopback callers, as the operator, when the
// listener is on loopback.
func (s *Server) checkpointHandler(ln net.Listener) (string, http.Handler, bool) {
	addr, ok := ln.Addr().(*net.TCPAddr)
	loopback := s.cfg.adminToken == "" && s.tenants == nil
	if loopback && (!ok || !addr.IP.IsLoopback()) {
		s.log.Info("the checkpoint service is off: the server does not listen on loopback and has no admin token or tenants")
		return "", nil, false
	}
	var auth rpc.Authenticator
	if !loopback {
		auth = (*authenticator)(s)
	}
	path, h := rpc.NewCheckpointHandler((*ckptService)(s), auth, loopback, errorCodes)
	return path, h, true
}

var _ rpc.Checkpoints = (*ckptService)(nil)
