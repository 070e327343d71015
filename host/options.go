package host

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/host/rpc"
	"github.com/moehost/moehost/modules"
	"github.com/moehost/moehost/sdk/swarm"
)

// Option configures a Server. Options are applied in order by New; a later
// option overrides an earlier one.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	listen          string
	dataDir         string
	compileCache    string
	logger          *slog.Logger
	experts         []ExpertConfig
	optimizer       OptimizerConfig
	limits          sandbox.Limits
	batching        BatchLimits
	maxRequestBytes int
	memoryLimit     int64 // 0: DefaultMemoryLimit; < 0: none
	corsOrigins     []string

	// Training state (checkpoints).
	checkpoints  *CheckpointConfig
	updatePeriod time.Duration
	adminToken   string
	// tenantsFile and maxUploadBytes are WithTenants' and
	// WithMaxUploadBytes'.
	tenantsFile    string
	maxUploadBytes int64
	// publicBackward, uploadIdle and uploadTimeout are
	// WithPublicBackward's and WithUploadTimeouts' (tenants.go).
	publicBackward            bool
	uploadIdle, uploadTimeout time.Duration
	// bodyIdle and bodyTimeout are WithBodyTimeouts'.
	bodyIdle, bodyTimeout time.Duration
	// exclusiveInstances: WithExclusiveInstances (share.go).
	exclusiveInstances bool
	dht                *DHTConfig
	hivemind           *HivemindConfig // WithHivemind (hivemind.go)
	// device is WithDevice's spec, and deviceOpts WithDeviceOptions'
	// (devices.go).
	device     string
	deviceOpts []gpuhost.DeviceOption
}

// BatchLimits configure the batching of one expert's requests; each
// expert has a forward pool and a backward pool with these limits. Zero
// fields take the defaults documented on the fields.
type BatchLimits = batch.Limits

// GuestLimits bound what each expert's Wasm instances may use. Zero
// fields take the defaults documented on the fields.
type GuestLimits = sandbox.Limits

// ModuleLimits bound what a module may declare, checked before it is
// compiled; they are GuestLimits' Module. Zero fields take the defaults.
type ModuleLimits = sandbox.ModuleLimits

// WithGuestLimits sets the limits of every expert's instances.
func WithGuestLimits(l GuestLimits) Option {
	return optionFunc(func(c *config) { c.limits = l })
}

// WithBatching sets the batch limits of every expert that does not set its
// own.
func WithBatching(b BatchLimits) Option {
	return optionFunc(func(c *config) { c.batching = b })
}

// WithListen sets the address to serve on, "host:port". A port of "*"
// picks a free port; read it with Server.Addr. Default "127.0.0.1:7700".
func WithListen(addr string) Option {
	return optionFunc(func(c *config) { c.listen = addr })
}

// WithDataDir sets the directory for the server's state (the compilation
// cache now; checkpoints and modules later). Default "moehost-data".
func WithDataDir(dir string) Option {
	return optionFunc(func(c *config) { c.dataDir = dir })
}

// CompileCacheEnv names the environment variable that, when set, is the
// default of WithCompileCache: one variable reaches every server a process
// tree starts (a test run's, say), as GOCACHE reaches every go command.
const CompileCacheEnv = "MOEHOST_COMPILE_CACHE"

// WithCompileCache sets the directory that keeps compiled machine code
// across restarts. Servers on one machine may share one: each entry is
// written to a temp file and renamed, and keyed by the module's bytes and
// the compiler's version. Default: $MOEHOST_COMPILE_CACHE, else
// "cache/wazero" in the data dir.
func WithCompileCache(dir string) Option {
	return optionFunc(func(c *config) { c.compileCache = dir })
}

// compileCacheDir is where the compilation cache lives (see
// WithCompileCache).
func (c *config) compileCacheDir() string { return CompileCacheDir(c.dataDir, c.compileCache) }

// CompileCacheDir is the compilation cache of a server with data dir
// dataDir and WithCompileCache(dir) (dir may be empty): dir, else
// $MOEHOST_COMPILE_CACHE, else "cache/wazero" in the data dir.
func CompileCacheDir(dataDir, dir string) string {
	if dir != "" {
		return dir
	}
	if dir := os.Getenv(CompileCacheEnv); dir != "" {
		return dir
	}
	return filepath.Join(dataDir, "cache", "wazero")
}

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithExperts adds experts to host.
func WithExperts(experts ...ExpertConfig) Option {
	return optionFunc(func(c *config) { c.experts = append(c.experts, experts...) })
}

// WithOptimizer sets the optimizer that trains every expert on Backward.
// Default Adam with PyTorch's defaults.
func WithOptimizer(o OptimizerConfig) Option {
	return optionFunc(func(c *config) { c.optimizer = o })
}

// WithMaxRequestBytes caps the size of one request message. Default 256 MiB.
func WithMaxRequestBytes(n int) Option {
	return optionFunc(func(c *config) { c.maxRequestBytes = n })
}

// The defaults of WithBodyTimeouts.
const (
	DefaultBodyIdleTimeout = rpc.DefaultBodyIdleTimeout
	DefaultBodyTimeout     = rpc.DefaultBodyTimeout
)

// WithBodyTimeouts bounds the request body of every call but a module
// upload (WithUploadTimeouts): it is cut (with DeadlineExceeded) when it
// sends nothing for idle, or is not all in after total, so that a client
// trickling a Forward's body cannot hold a goroutine, a buffer and a file
// descriptor for minutes. They bound the body only; the call then runs
// as long as its work takes. Zero takes the defaults,
// DefaultBodyIdleTimeout and DefaultBodyTimeout.
func WithBodyTimeouts(idle, total time.Duration) Option {
	return optionFunc(func(c *config) { c.bodyIdle, c.bodyTimeout = idle, total })
}

// ExpertConfig describes one expert to host.
type ExpertConfig struct {
	// UID names the expert, e.g. "ffn.3". Required and unique.
	UID string
	// Module is the expert's code.
	Module ModuleSource
	// Config holds the expert's integer settings, read by the module's
	// moe_init (e.g. "hidden_dim").
	Config map[string]int64
	// Batching overrides the server's batch limits for this expert.
	Batching *BatchLimits
	// Optimizer overrides the server's optimizer for this expert.
	Optimizer *OptimizerConfig
	// Owner names the tenant the expert belongs to, for Info and access
	// checks; empty for the operator's experts.
	Owner string
	// ForwardAccess and BackwardAccess say who may call Forward and
	// Backward. The zero value is AccessPublic, as in hivemind; a tenant's
	// deploy defaults Backward, which trains the expert, to AccessOwner,
	// and so does a server with tenants for the experts given with
	// WithExperts, unless WithPublicBackward.
	ForwardAccess, BackwardAccess Access
	// Limits overrides the non-zero fields among MemoryPages,
	// CallTimeout, BytesPerCall and ParamBytes of its owner's limits for
	// this expert (which then gets a runtime of its own).
	Limits *GuestLimits
}

// ModuleSource is where a module's bytes come from. Every module a server
// loads is kept in the module store of its data dir, so that a later
// server can name it by digest.
type ModuleSource struct {
	path   string
	data   []byte
	digest string
	name   string // for logs, with data
	// restores are the digests of other modules whose checkpoints this
	// one restores as its own (RestoresCheckpointsOf).
	restores []string
}

// ModuleFile reads the module from a .wasm file.
func ModuleFile(path string) ModuleSource { return ModuleSource{path: path} }

// ModuleBytes uses the given module bytes.
func ModuleBytes(wasm []byte) ModuleSource { return ModuleSource{data: wasm} }

// NamedModuleBytes uses the given module bytes, naming them in logs and
// errors (a built-in example's name, say).
func NamedModuleBytes(name string, wasm []byte) ModuleSource {
	return ModuleSource{data: wasm, name: name}
}

// ModuleDigest takes the module with the given digest ("sha256:<hex>")
// from the module store in the data dir.
func ModuleDigest(digest string) ModuleSource { return ModuleSource{digest: digest} }

// RestoresCheckpointsOf returns m, restoring the checkpoints saved by the
// modules with these digests as if it had saved them: for builds of one
// expert whose parameters and outputs are bitwise equal (the built-in ffn
// in C and in Go), so that switching between them keeps an expert's
// trained state without --allow-module-change, which would take any
// module of the same shapes. Parameter names and shapes are checked as
// always.
func (m ModuleSource) RestoresCheckpointsOf(digests ...string) ModuleSource {
	m.restores = append(slices.Clip(m.restores), digests...)
	return m
}

// String names the module for logs and errors: its file, "built-in
// bytes", or its digest.
func (m ModuleSource) String() string {
	switch {
	case m.path != "":
		return "module file " + m.path
	case len(m.data) > 0 && m.name != "":
		return "module " + m.name
	case len(m.data) > 0:
		return "module bytes"
	case m.digest != "":
		return "stored module"
	}
	return "no module"
}

func (m ModuleSource) empty() bool { return m.path == "" && len(m.data) == 0 && m.digest == "" }

// load returns the module's bytes.
func (m ModuleSource) load(store *modules.Store) ([]byte, error) {
	switch {
	case m.path != "":
		b, err := os.ReadFile(m.path)
		if err != nil {
			return nil, fmt.Errorf("reading module file: %w", err)
		}
		return b, nil
	case len(m.data) > 0:
		return m.data, nil
	case m.digest != "":
		return store.Get(m.digest)
	}
	return nil, errors.New("no module given")
}

// OptimizerConfig selects the optimizer applied after each backward batch,
// with the options of hivemind's run_server. Zero fields take torch's
// defaults for the algorithm. It is gpuhost's, the one config of the
// kernels, the server and the wire.
type OptimizerConfig = gpuhost.OptimizerConfig

// buildOptimizer checks o and makes its optimizer.
func buildOptimizer(o OptimizerConfig) (gpuhost.Optimizer, error) {
	if err := validateOptimizer(o); err != nil {
		return nil, err
	}
	return gpuhost.NewOptimizer(o.WithDefaults()), nil
}

// validateOptimizer reports a bad setting without the kernels' error
// prefix.
func validateOptimizer(o OptimizerConfig) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("optimizer: %s", strings.TrimPrefix(err.Error(), gpuhost.ErrArgument.Error()+": "))
	}
	return nil
}

func (c *config) validate() error {
	if c.listen == "" {
		return errors.New("moehost: listen address is empty")
	}
	if c.dataDir == "" {
		return errors.New("moehost: data dir is empty")
	}
	if err := c.validateDHT(); err != nil {
		return err
	}
	if err := c.validateHivemind(); err != nil {
		return err
	}
	if err := c.validateDevice(); err != nil {
		return err
	}
	if err := validateOptimizer(c.optimizer); err != nil {
		return fmt.Errorf("moehost: %w", err)
	}
	if c.updatePeriod <= 0 {
		return fmt.Errorf("moehost: update period %v is not positive", c.updatePeriod)
	}
	if err := validateCORSOrigins(c.corsOrigins); err != nil {
		return fmt.Errorf("moehost: %w", err)
	}
	if err := c.batching.Validate(); err != nil {
		return fmt.Errorf("moehost: batching: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range c.experts {
		if seen[e.UID] {
			return fmt.Errorf("moehost: expert %q is listed twice", e.UID)
		}
		seen[e.UID] = true
		if err := e.validate(c.checkpoints != nil); err != nil {
			return fmt.Errorf("moehost: %w", err)
		}
	}
	return nil
}

// validate checks one expert's config; withCheckpoints adds the checks
// that its uid be usable as a checkpoint directory.
func (e ExpertConfig) validate(withCheckpoints bool) error {
	if e.UID == "" {
		return errors.New("an expert has no uid")
	}
	if len(e.UID) > swarm.MaxNameLen {
		return fmt.Errorf("uid %.40q… is %d bytes, more than %d", e.UID, len(e.UID), swarm.MaxNameLen)
	}
	if err := CheckUID(e.UID); err != nil {
		return fmt.Errorf("expert %q: %w", e.UID, err)
	}
	// A uid the swarm could not find is refused here rather than served
	// unreachable (see swarm.CheckUID for the grammar).
	if err := swarm.CheckUID(e.UID); err != nil {
		return err
	}
	if e.Module.empty() {
		return fmt.Errorf("expert %q has no module", e.UID)
	}
	if e.Module.digest != "" {
		if _, err := modules.ParseDigest(e.Module.digest); err != nil {
			return fmt.Errorf("expert %q: %w", e.UID, err)
		}
	}
	if e.Batching != nil {
		if err := e.Batching.Validate(); err != nil {
			return fmt.Errorf("expert %q: batching: %w", e.UID, err)
		}
	}
	if e.Optimizer != nil {
		if err := validateOptimizer(*e.Optimizer); err != nil {
			return fmt.Errorf("expert %q: %w", e.UID, err)
		}
	}
	if withCheckpoints {
		if err := checkpoint.CheckUID(e.UID); err != nil {
			return err
		}
	}
	return nil
}

// WithMemoryLimit sets the server's memory limit in bytes. It is the Go
// runtime's soft limit (debug.SetMemoryLimit, set at Start and process
// wide) and the ceiling on live tensor bytes across the server's devices:
// an allocation that would pass it is refused before it happens, and the
// request that needed it gets ResourceExhausted while the server carries
// on. A negative n means no limit (the runtime's is left alone).
// Default: [DefaultMemoryLimit], DefaultMemoryFraction of the smaller of
// the cgroup's memory.max and the machine's MemTotal.
func WithMemoryLimit(n int64) Option {
	return optionFunc(func(c *config) { c.memoryLimit = n })
}

// DefaultUpdatePeriod is how often checkpoints are saved (and, with the
// DHT, experts announced): hivemind's update_period.
const DefaultUpdatePeriod = 30 * time.Second

// WithUpdatePeriod sets how often the server saves the checkpoints of
// experts that trained since the last save (and re-announces its experts).
// Default 30s.
func WithUpdatePeriod(d time.Duration) Option {
	return optionFunc(func(c *config) { c.updatePeriod = d })
}

// CheckpointConfig configures [WithCheckpoints].
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
	// Disabled turns checkpoints off, as if WithCheckpoints were not
	// given (serve's --no-checkpoints).
	Disabled bool
}

// WithCheckpoints makes the server restore each expert's newest valid
// checkpoint before it is ready, save every update period (when the
// expert's step changed) and on Shutdown. Without it, nothing is saved.
func WithCheckpoints(cfg CheckpointConfig) Option {
	return optionFunc(func(c *config) {
		c.checkpoints = &cfg
		if cfg.Disabled {
			c.checkpoints = nil
		}
	})
}

// WithAdminToken lets callers that send "Authorization: Bearer <token>"
// use the CheckpointService from any address. Without a token, it is
// served to loopback clients only.
func WithAdminToken(token string) Option {
	return optionFunc(func(c *config) { c.adminToken = token })
}
