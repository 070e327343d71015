package experts

import (
	"context"
	"fmt"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sched"
)

// lane is one device and the worker that runs its batches and tasks
// (snapshots, restores). Each expert belongs to one lane for its life.
type lane struct {
	dev    gpuhost.Device
	worker *sched.Worker
	tasks  *taskPool
}

// taskGroup is the task pools' group on the workers, no tenant's (a
// tenant's name has no NUL) and not the operator's: a snapshot that waits
// for an expert's batch (one in guest code until its call timeout, say)
// is in flight meanwhile, and must not count against the operator's
// batches in flight.
const taskGroup = "\x00tasks"

// makeLanes gives each device a worker and a task pool.
func makeLanes(devs []gpuhost.Device) []*lane {
	lanes := make([]*lane, len(devs))
	for i, d := range devs {
		w := sched.NewWorker()
		tp := &taskPool{notify: w.Notify}
		w.Add(tp, sched.WithGroup(taskGroup, 1))
		lanes[i] = &lane{dev: d, worker: w, tasks: tp}
	}
	return lanes
}

// Devices returns each lane's device, the first device first; none
// before Open.
func (r *Registry) Devices() []gpuhost.Device {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.devicesLocked()
}

func (r *Registry) devicesLocked() []gpuhost.Device {
	devs := make([]gpuhost.Device, len(r.lanes))
	for i, ln := range r.lanes {
		devs[i] = ln.dev
	}
	return devs
}

// pickLane returns the lane for a new expert: the one with the fewest
// experts, the first of them on a tie, which is round robin as experts
// are added.
func (r *Registry) pickLane() *lane {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lanes) == 1 {
		return r.lanes[0]
	}
	count := make(map[gpuhost.Device]int, len(r.lanes))
	for _, e := range r.experts {
		count[e.Device()]++
	}
	best := r.lanes[0]
	for _, ln := range r.lanes[1:] {
		if count[ln.dev] < count[best.dev] {
			best = ln
		}
	}
	return best
}

// laneOf returns the lane of e's device.
func (r *Registry) laneOf(e *Expert) *lane {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ln := range r.lanes {
		if ln.dev == e.Device() {
			return ln
		}
	}
	panic(fmt.Sprintf("BUG: expert %q is on device %s, which no lane has", e.uid, e.Device().Name()))
}

// workers returns each lane's worker: none before Open.
func (r *Registry) workers() []*sched.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := make([]*sched.Worker, len(r.lanes))
	for i, ln := range r.lanes {
		ws[i] = ln.worker
	}
	return ws
}

// MultiLane reports whether the experts go to several devices.
func (r *Registry) MultiLane() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lanes) > 1
}

// StartWorkers starts every lane's worker.
func (r *Registry) StartWorkers(ctx context.Context) {
	for _, w := range r.workers() {
		w.Start(ctx)
	}
}

// closeWorkers stops every lane's worker, letting running batches end.
func (r *Registry) closeWorkers(ctx context.Context) {
	for _, w := range r.workers() {
		w.Close(ctx)
	}
}
