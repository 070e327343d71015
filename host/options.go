package host

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/internal/expertlimits"
	"github.com/moehost/moehost/sdk/swarm"
)

// WithExclusiveInstances gives every expert its own Wasm instance, as
// before instances were shared. By default experts deployed from the same
// module digest with the same config share one instance (there is one
// device worker), and each batch binds the expert's parameters to it, so
// that an expert costs its parameters and optimizer state, not an
// instance. It exists for the density benchmark's baseline.
func WithExclusiveInstances() Option {
	return optionFunc(func(c *config) { c.exclusiveInstances = true })
}

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
	compileChild    []sandbox.CacheOption // WithCompileInChild (compilechild.go)
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
	maxUploads     int // WithMaxUploads
	// publicBackward, uploadIdle and uploadTimeout are
	// WithPublicBackward's and WithUploadTimeouts' (tenants.go).
	publicBackward            bool
	uploadIdle, uploadTimeout time.Duration
	// bodyIdle and bodyTimeout are WithBodyTimeouts'.
	bodyIdle, bodyTimeout time.Duration
	// drainTimeout is WithDrainTimeout's.
	drainTimeout time.Duration
	// minBodyRate is WithMinBodyRate's.
	minBodyRate int64
	// exclusiveInstances: WithExclusiveInstances (share.go).
	exclusiveInstances bool
	dht                *DHTConfig
	tls                *TLSConfig      // WithTLS (tls.go)
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

// ExpertLimits bound one expert's calls (ExpertConfig.Limits): its own
// MemoryPages, CallTimeout, BytesPerCall and ParamBytes, over its owner's
// GuestLimits. It is the one type of an expert's limits, which the wire's
// deploy requests and the tenants' caps use too.
type ExpertLimits = expertlimits.Limits

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

// DefaultMinBodyRate is the slowest a request body or a module upload
// may arrive on average, in bytes a second, once rpc.MinRateGrace (5 s)
// is over.
const DefaultMinBodyRate = rpc.DefaultMinBodyRate

// WithMinBodyRate cuts, with DeadlineExceeded, a request body or a module
// upload that averages less than rate bytes a second once
// rpc.MinRateGrace is over: one that trickles a byte every second or two
// passes every idle deadline. Zero takes DefaultMinBodyRate; negative
// sets no floor.
func WithMinBodyRate(rate int64) Option {
	return optionFunc(func(c *config) { c.minBodyRate = rate })
}

// DefaultDrainTimeout is how long Run lets the batches in flight finish
// at shutdown before it cancels them.
const DefaultDrainTimeout = 10 * time.Second

// WithDrainTimeout bounds how long Run, once its context ends, waits for
// the batches in flight to finish before it cancels them (a guest that
// spins is then stopped at once, not at its call timeout). Zero takes
// DefaultDrainTimeout.
func WithDrainTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.drainTimeout = d })
}

// OptimizerConfig selects the optimizer applied after each backward batch,
// with the options of hivemind's run_server. Zero fields take torch's
// defaults for the algorithm. It is gpuhost's, the one config of the
// kernels, the server and the wire.
type OptimizerConfig = gpuhost.OptimizerConfig

func (c *config) validate() error {
	if c.listen == "" {
		return errors.New("moehost: listen address is empty")
	}
	if c.dataDir == "" {
		return errors.New("moehost: data dir is empty")
	}
	if err := c.validateTLS(); err != nil {
		return err
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
	if err := experts.ValidateOptimizer(c.optimizer); err != nil {
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
		if err := e.Validate(c.checkpoints != nil); err != nil {
			return fmt.Errorf("moehost: %w", err)
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
type CheckpointConfig = experts.CheckpointConfig

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

// ExpertConfig describes one expert to host: its uid, module, config,
// batching, optimizer, owner, accesses and limits (the experts room's
// Spec, whose fields say more).
type ExpertConfig = experts.Spec

// ModuleSource is where a module's bytes come from. Every module a server
// loads is kept in the module store of its data dir, so that a later
// server can name it by digest.
type ModuleSource = experts.ModuleSource

// ModuleFile reads the module from a .wasm file.
func ModuleFile(path string) ModuleSource { return experts.ModuleFile(path) }

// ModuleBytes uses the given module bytes.
func ModuleBytes(wasm []byte) ModuleSource { return experts.ModuleBytes(wasm) }

// NamedModuleBytes uses the given module bytes, and names them in logs
// and errors (a built-in module's name, say).
func NamedModuleBytes(name string, wasm []byte) ModuleSource {
	return experts.NamedModuleBytes(name, wasm)
}

// ModuleDigest names a module in the data dir's module store by its
// digest ("sha256:<hex>").
func ModuleDigest(digest string) ModuleSource { return experts.ModuleDigest(digest) }

// Access says who may call one of an expert's methods. The zero Access
// means public.
type Access = experts.Access

// The accesses.
const (
	AccessPublic  = experts.AccessPublic
	AccessOwner   = experts.AccessOwner
	AccessTenants = experts.AccessTenants
)

// MaxUIDBytes bounds a uid (and a pattern): the swarm's MaxNameLen.
const MaxUIDBytes = swarm.MaxNameLen

// CheckUID returns an error unless uid follows the one uid grammar, the
// swarm's (swarm.CheckUID): dot-separated parts of A-Z, a-z, 0-9, '-' and
// '_', names then grid coordinates, so that the swarm can find it.
func CheckUID(uid string) error { return swarm.CheckUID(uid) }

// ExpandPattern expands hivemind's expert_pattern syntax ("ffn.[0:4]",
// "ffn.[0:2].[0:3]") into uids, in order.
func ExpandPattern(pattern string) ([]string, error) { return experts.ExpandPattern(pattern) }

// checkpointConfig resolves WithCheckpoints for the experts room: nil
// when off, else with its dir and keep count filled in.
func (c *config) checkpointConfig() *experts.CheckpointConfig {
	if c.checkpoints == nil {
		return nil
	}
	cfg := *c.checkpoints
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(c.dataDir, "checkpoints")
	}
	if cfg.Keep == 0 {
		cfg.Keep = 3
	}
	return &cfg
}
