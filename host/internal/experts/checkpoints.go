package experts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/internal/pages"
)

// snapshot is an expert's training state, copied off the device.
type snapshot = checkpoint.Checkpoint

// discardSnapshot gives the memory of a snapshot that nothing else holds
// back to the operating system, once it is written: an expert's copy (100
// MB for the ffn at hidden 1024, with Adam) would otherwise stay in RSS
// until a collection, which an idle server does not run.
func discardSnapshot(s *snapshot) {
	for _, ts := range [][]checkpoint.Tensor{s.Params, s.Optim} {
		for _, t := range ts {
			pages.Discard(t.Data)
		}
	}
}

// takeSnapshot copies e's parameters, optimizer state and counters, and
// returns the count of updates they reflect. It holds e.mu, so it sees
// the state between two batches; called on the device worker (ctx is its
// task's) or once it has stopped, it waits at most for a batch of e
// detached in guest code, and then off the device.
func (e *Expert) takeSnapshot(ctx context.Context) (*snapshot, int64, error) {
	lockOffDevice(ctx, &e.mu)
	defer e.mu.Unlock()
	s, err := e.snapshotLocked()
	return s, e.trainer.updates.Load(), err
}

func (e *Expert) snapshotLocked() (*snapshot, error) {
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
func (e *Expert) restoreFrom(ctx context.Context, c *snapshot, lazy *checkpoint.Lazy, allowChange bool, warn func(msg string, args ...any)) error {
	if lazy == nil {
		// A serving expert's batches hold e.mu: restore between them
		// (ctx is the device worker's task). One that serves nothing
		// yet is nobody else's.
		lockOffDevice(ctx, &e.mu)
		defer e.mu.Unlock()
	}
	store := e.guest.binding.Params
	ps := store.Declared() // a lazy restore leaves the draws undone
	if lazy == nil {
		ps = store.Params()
	}
	if err := paramsMatch(c, ps); err != nil {
		if d := configDiff(c.Config, e.guest.binding.Config); c.Config != nil && d != "" {
			// Other shapes mostly come from another config: name it.
			return fmt.Errorf("%w (the config differs: %s)", err, d)
		}
		return err
	}
	if !allowChange {
		// The shapes match, so --allow-module-change can help here.
		if c.ModuleDigest != e.guest.digest() && !slices.Contains(e.guest.restores, c.ModuleDigest) {
			return fmt.Errorf("%w: %w: %q step %d was saved by module %s, but the expert runs %s; the parameters' names and shapes match, so a rebuilt module may restore it with --allow-module-change",
				ErrCheckpointMismatch, errCheckpointShapesMatch, e.uid, c.Step, c.ModuleDigest, e.guest.digest())
		}
		if c.Config != nil && !maps.Equal(c.Config, e.guest.binding.Config) {
			return fmt.Errorf("%w: %w: %q step %d was saved with another config (%s); the parameters' names and shapes match, so --allow-module-change restores it anyway",
				ErrCheckpointMismatch, errCheckpointShapesMatch, e.uid, c.Step, configDiff(c.Config, e.guest.binding.Config))
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

// configDiff names each config key whose value differs between a
// checkpoint's config (was) and the expert's (now), as "hidden_dim 64 →
// 128", sorted by key; a key on one side only reads "(none)" on the
// other. It is "" when they are equal.
func configDiff(was, now map[string]int64) string {
	val := func(m map[string]int64, k string) string {
		if v, ok := m[k]; ok {
			return strconv.FormatInt(v, 10)
		}
		return "(none)"
	}
	keys := slices.Sorted(maps.Keys(was))
	for k := range now {
		if _, ok := was[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		if a, b := val(was, k), val(now, k); a != b {
			parts = append(parts, k+" "+a+" → "+b)
		}
	}
	return strings.Join(parts, ", ")
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

// CheckpointConfig configures the checkpoints (host.WithCheckpoints).
type CheckpointConfig struct {
	// Dir holds the checkpoints, one directory per expert. Default
	// "<data dir>/checkpoints".
	Dir string
	// Keep is how many checkpoints per expert are kept; older ones are
	// pruned. Default 3; negative keeps all.
	Keep int
	// AllowModuleChange restores a checkpoint saved by another module
	// digest, as long as the parameters' names and shapes match.
	AllowModuleChange bool
	// Signer signs each checkpoint's state root; nil writes manifests
	// unsigned.
	Signer checkpoint.Signer
	// Disabled turns checkpoints off, as if WithCheckpoints were not
	// given (serve's --no-checkpoints).
	Disabled bool
}

// checkpointer saves and restores the experts of a server.
type checkpointer struct {
	store *checkpoint.Store
	cfg   CheckpointConfig
	reg   *Registry

	mu    sync.Mutex       // serialises writes
	saved map[string]int64 // last step written, by uid
	// savedTime is when the checkpoint at saved[uid] was written, for
	// the dashboard.
	savedTime map[string]time.Time
	// savedAt is each expert's trainer.updates when its state was last
	// written or restored: while they match, a save has nothing to do.
	savedAt map[string]int64
	// roots is the state root of the checkpoint at saved[uid].
	roots map[string]string
}

// restore loads the newest checkpoint of e that validates. A corrupt one
// is skipped with a warning; a mismatch (digest, shapes) is an error.
func (c *checkpointer) restore(e *Expert) error {
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
			c.reg.log.Warn("skipping a checkpoint that does not load", "uid", e.uid, "step", in.Step, "err", err)
			continue
		}
		// A lazy restore takes no lock, so it needs no worker's context.
		err = e.restoreFrom(context.Background(), &ck.Checkpoint, ck, c.cfg.AllowModuleChange, c.reg.log.Warn)
		ck.Close()
		if errors.Is(err, errCheckpointRead) {
			c.reg.log.Warn("skipping a checkpoint that does not load", "uid", e.uid, "step", in.Step, "err", err)
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
		root := ""
		if sm, err := c.store.Manifest(e.uid, in.Step); err != nil {
			c.reg.log.Warn("the restored checkpoint has no manifest: its state is not announced", "uid", e.uid, "step", in.Step, "err", err)
		} else {
			root = sm.Root
		}
		c.mu.Lock()
		c.saved[e.uid], c.savedTime[e.uid] = ck.Step, in.Time
		c.savedAt[e.uid] = e.trainer.updates.Load() // nothing else runs it yet
		c.roots[e.uid] = root
		c.mu.Unlock()
		c.reg.log.Info("restored checkpoint", "uid", e.uid, "step", ck.Step, "examples", ck.Examples)
		return nil
	}
	return nil
}

// maxBytes bounds a checkpoint file: the expert's parameters (or their
// optimizer buffers, two per parameter) plus a header.
func (c *checkpointer) maxBytes() int64 {
	pb := c.reg.cfg.Limits.WithDefaults().ParamBytes
	if pb <= 0 {
		return 0
	}
	return 2*pb + 1<<20
}

// save snapshots e on the device worker (or directly when onWorker is
// false, once the worker has stopped) and writes it, unless its step was
// saved already and force is false. It returns the step written. Each
// save that wrote or failed is counted in /metrics; one with nothing to
// write is not.
func (c *checkpointer) save(ctx context.Context, e *Expert, onWorker, force bool) (int64, bool, error) {
	step, wrote, err := c.write(ctx, e, onWorker, force)
	if wrote || err != nil {
		_, at, _ := c.last(e.uid)
		c.reg.cfg.Metrics.saved(e.uid, at, err)
	}
	return step, wrote, err
}

// last returns the step and time of the checkpoint of uid last written
// or restored.
func (c *checkpointer) last(uid string) (step int64, at time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	step, ok = c.saved[uid]
	return step, c.savedTime[uid], ok
}

// write is save without the metrics.
func (c *checkpointer) write(ctx context.Context, e *Expert, onWorker, force bool) (int64, bool, error) {
	if !force {
		// Nothing stepped or restored since the last write or restore:
		// the files hold this state already, and copying it (134 MB for
		// make run's experts) would show only that.
		// An expert never trained nor restored holds its initial values,
		// which its uid draws again at the next start: the README's
		// "saves when the step changed" writes no step 0 for it.
		c.mu.Lock()
		last, ok := c.saved[e.uid]
		at, okAt := c.savedAt[e.uid]
		c.mu.Unlock()
		if ok && okAt && at == e.trainer.updates.Load() {
			return last, false, nil
		}
		if !ok && e.trainer.updates.Load() == 0 {
			return 0, false, nil
		}
	}
	var (
		snap    *snapshot
		gen     int64
		snapErr error
	)
	if onWorker {
		if err := c.reg.laneOf(e).tasks.run(ctx, func(ctx context.Context) { snap, gen, snapErr = e.takeSnapshot(ctx) }); err != nil {
			return 0, false, err
		}
	} else {
		snap, gen, snapErr = e.takeSnapshot(ctx)
	}
	if snapErr != nil {
		return 0, false, snapErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A step that was written already, or a step 0 never written (a
	// failed first step counts as an update but trained nothing).
	if last, ok := c.saved[e.uid]; (ok && last == snap.Step || !ok && snap.Step == 0) && !force {
		c.savedAt[e.uid] = gen
		return snap.Step, false, nil
	}
	sm, err := c.store.SaveManifest(snap)
	discardSnapshot(snap)
	if err != nil {
		return 0, false, err
	}
	c.roots[e.uid] = sm.Root
	c.saved[e.uid], c.savedTime[e.uid] = snap.Step, time.Now()
	c.savedAt[e.uid] = gen
	return snap.Step, true, nil
}

// saveAll saves every expert whose step changed; errors are logged, and
// so is each save, at Info as restores are: an operator sees from the
// log alone what a restart will resume from.
func (c *checkpointer) saveAll(ctx context.Context, experts []*Expert, onWorker bool) {
	for _, e := range experts {
		step, wrote, err := c.save(ctx, e, onWorker, false)
		switch {
		case err != nil:
			c.reg.log.Error("saving checkpoint", "uid", e.uid, "err", err)
		case wrote:
			c.reg.log.Info("saved checkpoint", "uid", e.uid, "step", step)
		}
	}
}

// loop saves every period until stop is closed.
func (c *checkpointer) loop(stop <-chan struct{}, period time.Duration, experts func() []*Expert) {
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
	at time.Time
	// fn gets the device worker's context for the task, which lets it
	// wait for a lock off the device (lockOffDevice).
	fn   func(context.Context)
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

func (p *taskPool) RunBatch(ctx context.Context) {
	p.mu.Lock()
	if len(p.tasks) == 0 {
		p.mu.Unlock()
		return
	}
	t := p.tasks[0]
	p.tasks = p.tasks[1:]
	p.mu.Unlock()
	t.fn(ctx)
	close(t.done)
}

// run queues fn and waits until the worker has run it, or ctx ends (then
// fn may still run later, so it must only write what the caller reads
// after a nil return).
func (p *taskPool) run(ctx context.Context, fn func(context.Context)) error {
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
func optimizerJSON(o gpuhost.OptimizerConfig) string {
	b, _ := json.Marshal(o.WithDefaults())
	return string(b)
}

// openCheckpointer opens the checkpoint store of cfg (Dir and Keep
// resolved) for r's experts.
func openCheckpointer(cfg CheckpointConfig, r *Registry) (*checkpointer, error) {
	var opts []checkpoint.Option
	if cfg.Signer != nil {
		opts = append(opts, checkpoint.WithSigner(cfg.Signer))
	}
	store, err := checkpoint.Open(cfg.Dir, cfg.Keep, opts...)
	if err != nil {
		return nil, err
	}
	return &checkpointer{store: store, cfg: cfg, reg: r, saved: map[string]int64{}, savedTime: map[string]time.Time{},
		savedAt: map[string]int64{}, roots: map[string]string{}}, nil
}

// StartSaving starts saving every period the checkpoints of the experts
// that trained since their last save, until Stop.
func (r *Registry) StartSaving(period time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ckpt == nil || r.stopSave != nil {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	r.stopSave, r.saveDone = stop, done
	c := r.ckpt
	go func() {
		defer close(done)
		c.loop(stop, period, r.All)
	}()
}

// stopSaving stops the periodic saver, if it runs, and waits for it.
func (r *Registry) stopSaving() {
	r.mu.Lock()
	stop, done := r.stopSave, r.saveDone
	r.stopSave = nil
	r.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
}

// checkpointer returns the checkpointer, or ErrCheckpointsOff.
func (r *Registry) checkpointer() (*checkpointer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ckpt == nil {
		return nil, ErrCheckpointsOff
	}
	return r.ckpt, nil
}

// SaveCheckpoint writes e's state now, on its device worker, whether or
// not it changed, and returns the stored checkpoint.
func (r *Registry) SaveCheckpoint(ctx context.Context, e *Expert) (checkpoint.Info, error) {
	c, err := r.checkpointer()
	if err != nil {
		return checkpoint.Info{}, err
	}
	step, _, err := c.save(ctx, e, true, true)
	if err != nil {
		return checkpoint.Info{}, err
	}
	return c.find(e.uid, step)
}

// find returns uid's stored checkpoint at step, or one with the uid and
// step alone when the store has pruned it meanwhile.
func (c *checkpointer) find(uid string, step int64) (checkpoint.Info, error) {
	infos, err := c.store.List(uid)
	if err != nil {
		return checkpoint.Info{}, err
	}
	for _, in := range infos {
		if in.Step == step {
			return in, nil
		}
	}
	return checkpoint.Info{UID: uid, Step: step}, nil
}

// LastCheckpoint returns the step of uid's checkpoint that the server
// last wrote or restored, and when it was written; ok is false when there
// is none, or checkpoints are off.
func (r *Registry) LastCheckpoint(uid string) (step int64, at time.Time, ok bool) {
	c, err := r.checkpointer()
	if err != nil {
		return 0, time.Time{}, false
	}
	return c.last(uid)
}

// LatestState returns the state root and step of the checkpoint of uid
// last written or restored; ok is false when there is none, or
// checkpoints are off.
func (r *Registry) LatestState(uid string) (root string, step int64, ok bool) {
	c, err := r.checkpointer()
	if err != nil {
		return "", 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	root, ok = c.roots[uid]
	return root, c.saved[uid], ok && root != ""
}

// CheckpointStore returns the checkpoint store, or ErrCheckpointsOff.
// Its files are immutable once written, so that the blob room serves
// them without any lock of the experts'.
func (r *Registry) CheckpointStore() (*checkpoint.Store, error) {
	c, err := r.checkpointer()
	if err != nil {
		return nil, err
	}
	return c.store, nil
}

// Checkpoints lists uid's stored checkpoints, newest first.
func (r *Registry) Checkpoints(uid string) ([]checkpoint.Info, error) {
	c, err := r.checkpointer()
	if err != nil {
		return nil, err
	}
	return c.store.List(uid)
}

// RestoreCheckpoint loads e's stored checkpoint at step (the newest with
// step nil) into it, between its batches, and returns it.
func (r *Registry) RestoreCheckpoint(ctx context.Context, e *Expert, step *int64) (checkpoint.Info, error) {
	c, err := r.checkpointer()
	if err != nil {
		return checkpoint.Info{}, err
	}
	uid := e.uid
	infos, err := c.store.List(uid)
	if err != nil {
		return checkpoint.Info{}, err
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
			return checkpoint.Info{}, fmt.Errorf("%w: expert %q has none", checkpoint.ErrNotFound, uid)
		}
		return checkpoint.Info{}, fmt.Errorf("%w: expert %q has none at step %d", checkpoint.ErrNotFound, uid, *step)
	}
	ck, err := c.store.Load(uid, pick.Step, c.maxBytes())
	if err != nil {
		return checkpoint.Info{}, fmt.Errorf("%w: %w", ErrCheckpointUnreadable, err)
	}
	var restoreErr error
	if err := r.laneOf(e).tasks.run(ctx, func(ctx context.Context) {
		restoreErr = e.restoreFrom(ctx, ck, nil, c.cfg.AllowModuleChange, r.log.Warn)
	}); err != nil {
		return checkpoint.Info{}, err
	}
	if restoreErr != nil {
		return checkpoint.Info{}, restoreErr
	}
	c.mu.Lock()
	c.saved[uid], c.savedTime[uid] = ck.Step, pick.Time
	c.mu.Unlock()
	r.log.Info("restored checkpoint on request", "uid", uid, "step", ck.Step)
	return *pick, nil
}

// Snapshot copies e's parameters, optimizer state and counters off its
// device, between its batches.
func (r *Registry) Snapshot(ctx context.Context, e *Expert) (*checkpoint.Checkpoint, error) {
	var (
		snap    *snapshot
		snapErr error
	)
	if err := r.laneOf(e).tasks.run(ctx, func(ctx context.Context) { snap, _, snapErr = e.takeSnapshot(ctx) }); err != nil {
		return nil, err
	}
	return snap, snapErr
}
