package cli

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/moehost/moehost/host"
)

// trainFlags are serve's flags for the optimizer, its schedule and
// checkpoints, as in hivemind's run_server.
type trainFlags struct {
	momentum, weightDecay, clipGradNorm float64
	scheduler                           string
	warmupSteps, trainingSteps          int64
	keep                                int
	noCheckpoints, allowModuleChange    bool
	adminToken                          string
	updatePeriod                        time.Duration
}

func (t *trainFlags) register(f *pflag.FlagSet) {
	f.Float64Var(&t.momentum, "momentum", 0, "SGD momentum")
	f.Float64Var(&t.weightDecay, "weight-decay", 0, "weight decay: L2 on the gradient (adam, sgd) or decoupled (adamw; 0 means 1e-2)")
	f.Float64Var(&t.clipGradNorm, "clip-grad-norm", 0, "if positive, clip each step's gradients to this global L2 norm")
	f.StringVar(&t.scheduler, "scheduler", "none", "learning-rate schedule: linear (warmup, then linear decay to 0) or none")
	f.Int64Var(&t.warmupSteps, "num-warmup-steps", 0, "warmup steps of the linear schedule")
	f.Int64Var(&t.trainingSteps, "num-training-steps", 0, "total steps of the linear schedule")
	f.IntVar(&t.keep, "keep-checkpoints", 3, "checkpoints kept per expert; older ones are pruned (negative keeps all)")
	f.BoolVar(&t.noCheckpoints, "no-checkpoints", false, "neither restore nor save checkpoints")
	f.BoolVar(&t.allowModuleChange, "allow-module-change", false, "restore checkpoints saved by another module digest when the parameters match")
	f.StringVar(&t.adminToken, "admin-token", "", "bearer token that lets non-loopback clients use the CheckpointService")
	f.DurationVar(&t.updatePeriod, "update-period", host.DefaultUpdatePeriod, "how often checkpoints are saved (when an expert's step changed) and experts are announced to the DHT (records expire after max(2x this, 3s))")
}

func (t *trainFlags) optimizer(name string, lr float64) host.OptimizerConfig {
	return host.OptimizerConfig{
		Name: name, LR: lr, Momentum: t.momentum, WeightDecay: t.weightDecay, ClipGradNorm: t.clipGradNorm,
		Scheduler: t.scheduler, NumWarmupSteps: t.warmupSteps, NumTrainingSteps: t.trainingSteps,
	}
}

// checkpoints returns the checkpoint option: on, in the data dir, unless
// --no-checkpoints.
func (t *trainFlags) checkpoints() host.Option {
	if t.noCheckpoints {
		return host.WithCheckpoints(host.CheckpointConfig{Keep: t.keep, Disabled: true})
	}
	return host.WithCheckpoints(host.CheckpointConfig{Keep: t.keep, AllowModuleChange: t.allowModuleChange})
}
