// Package sandbox runs expert modules in wazero and implements the host
// side of ABI v1 (package abi) on top of gpuhost.
//
// A [Runtime] compiles modules once, with wazero's compilation cache on
// disk, and makes [Instance]s of them. Each instance has its own handle
// tables, phase and budgets; the host functions find them through the
// context of the current call, so one host module serves every instance.
// Nothing the guest does reaches the host as a panic: bad handles, pointers
// and shapes come back to the guest as abi.Errno codes, and traps come back
// to the host's caller as [ErrTrap], after which the instance is closed.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/internal/expertlimits"
)

// Errors returned by the sandbox. Callers branch on them with errors.Is.
var (
	// ErrInvalidModule: the module does not compile or does not follow
	// the ABI (imports, exports, version).
	ErrInvalidModule = errors.New("invalid expert module")
	// ErrTrap: the guest trapped, exited or ran out of time; its
	// instance is closed and must be replaced.
	ErrTrap = errors.New("guest trap")
	// ErrGuest: an export returned an error code; the instance is still
	// usable.
	ErrGuest = errors.New("guest error")
	// ErrInvalidInput: the inputs handed to Forward do not fit the
	// declared schema.
	ErrInvalidInput = errors.New("invalid input")
	// ErrUnknownConfigKey: the expert's config has a key that the
	// module's moe_init does not read.
	ErrUnknownConfigKey = errors.New("unknown config key")
	// ErrConfigRefused: the module's moe_init refused the config it read
	// (it returned ErrInvalidArgument): the caller's config value, not
	// the module, is at fault. It matches ErrGuest too.
	ErrConfigRefused = errors.New("config refused by the module")
	// ErrClosed: the instance was closed.
	ErrClosed = errors.New("instance closed")
	// ErrBudget matches a refusal for a spent budget (the call's bytes,
	// ops or host calls, or the expert's parameter bytes): the host's own
	// refusal, or a guest that returned abi.ErrBudgetExceeded.
	ErrBudget = errors.New("budget exceeded")
)

// Limits bound what one instance may use. Zero fields take the defaults.
type Limits struct {
	// MemoryPages caps guest linear memory, in 64 KiB pages. Default
	// 4096 (256 MiB); tensors live on the host, so guests need little.
	MemoryPages uint32
	// OpsPerCall caps op, op_multi and tensor_new calls, failed ones
	// included, in one export call. Default 100000.
	OpsPerCall int
	// BytesPerCall caps the host memory one export call may make:
	// tensor bytes (with a tape, also what its backward will allocate)
	// plus TensorOverhead per tensor. Default 2 GiB, which serves 1,024
	// rows of ffn at hidden_dim 1024 eight times over and 16 rows of the
	// transformer at its defaults (make measure-budget).
	BytesPerCall int64
	// ParamBytes caps the parameter bytes of one expert, ParamOverhead
	// per parameter included. Default 4 GiB.
	ParamBytes int64
	// InitTimeout bounds _initialize and moe_init together: their wall
	// time, or with LowPriorityInit their CPU time. Default 30s.
	InitTimeout time.Duration
	// LowPriorityInit runs _initialize and moe_init on a thread of their
	// own at nice 19, so that a spinning init takes no core from other
	// tenants' calls; InitTimeout then bounds their CPU time, and their
	// wall time is bounded at 4 times as long (on Linux; elsewhere
	// neither changes). Tenants' runtimes set it; the operator's experts
	// start at normal priority, since they are the operator's own and
	// at startup nothing else is served yet.
	LowPriorityInit bool
	// CallTimeout bounds one moe_forward or moe_backward call; a guest
	// past it is stopped and its instance discarded. Default 60s: about
	// 6× the zoo's worst batch at the default deployment (ffn,
	// hidden_dim 1024, a backward of 1024 rows: 9.3s on a loaded 2-core
	// box), see RATIONALE.
	CallTimeout time.Duration
	// HostCallsPerCall caps the calls of host functions (every one of
	// them, WASI's too, failed ones included) in one export call,
	// moe_init included. A WASI call past it traps: WASI has no code for
	// "budget exceeded".
	// Default 1000000: ten for each op of OpsPerCall's default.
	HostCallsPerCall int
	// MaxInputs and MaxOutputs cap the inputs and outputs moe_init may
	// declare. Default 64 each.
	MaxInputs, MaxOutputs int
	// MaxParams caps the parameters moe_init may declare. Default 16384;
	// at most 2²⁰.
	MaxParams int
	// Module bounds what a module may declare (see ModuleLimits).
	Module ModuleLimits
}

// Expert returns the per-expert part of l: what one expert's own limits
// may set (expertlimits.Limits, the one type of them).
func (l Limits) Expert() expertlimits.Limits {
	return expertlimits.Limits{MemoryPages: l.MemoryPages, CallTimeout: l.CallTimeout, BytesPerCall: l.BytesPerCall, ParamBytes: l.ParamBytes}
}

// WithExpert returns l with an expert's own limits' non-zero fields in
// place of its own.
func (l Limits) WithExpert(own expertlimits.Limits) Limits {
	e := own.Over(l.Expert())
	l.MemoryPages, l.CallTimeout, l.BytesPerCall, l.ParamBytes = e.MemoryPages, e.CallTimeout, e.BytesPerCall, e.ParamBytes
	return l
}

// WithDefaults returns l with its zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MemoryPages == 0 {
		l.MemoryPages = 4096
	}
	if l.OpsPerCall == 0 {
		l.OpsPerCall = 100000
	}
	if l.BytesPerCall == 0 {
		l.BytesPerCall = 2 << 30
	}
	if l.ParamBytes == 0 {
		l.ParamBytes = 4 << 30
	}
	if l.InitTimeout == 0 {
		l.InitTimeout = 30 * time.Second
	}
	if l.CallTimeout == 0 {
		l.CallTimeout = time.Minute
	}
	if l.HostCallsPerCall == 0 {
		l.HostCallsPerCall = 1000000
	}
	if l.MaxInputs == 0 {
		l.MaxInputs = 64
	}
	if l.MaxOutputs == 0 {
		l.MaxOutputs = 64
	}
	if l.MaxParams == 0 {
		l.MaxParams = 16384
	}
	l.MaxParams = min(l.MaxParams, maxParams)
	l.Module = l.Module.withDefaults()
	return l
}

// Runtime compiles and instantiates expert modules. It is safe for
// concurrent use.
type Runtime struct {
	r      wazero.Runtime
	cache  *Cache // closed with the runtime when it opened it
	owned  bool
	limits Limits
}

// Cache keeps compiled machine code on disk across restarts. One cache
// serves several runtimes (one per tenant), so that a module two tenants
// upload compiles once.
type Cache struct {
	c         wazero.CompilationCache
	dir       string   // where a compile child writes what the runtime then reads
	child     []string // the compile child's command line; nil: compile in the process
	wantChild bool     // WithCompileChild, before resolveChild
}

// CacheOption configures a Cache (OpenCache).
type CacheOption interface{ apply(*Cache) }

type cacheOption func(*Cache)

func (o cacheOption) apply(c *Cache) { o(c) }

// OpenCache opens (creating it) the compilation cache in dir.
func OpenCache(dir string, opts ...CacheOption) (*Cache, error) {
	cache := &Cache{dir: dir}
	for _, o := range opts {
		o.apply(cache)
	}
	if err := cache.resolveChild(); err != nil {
		return nil, fmt.Errorf("opening compilation cache %q: %w", dir, err)
	}
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening compilation cache %q: %w", dir, err)
	}
	cache.c = c
	return cache, nil
}

// Close releases the cache; close the runtimes that use it first.
func (c *Cache) Close(ctx context.Context) error { return c.c.Close(ctx) }

// NewRuntime starts a wazero runtime with the ABI's host module. cacheDir,
// when not empty, keeps compiled machine code across restarts, in a cache
// opened with opts; without one, opts do nothing (a compile child hands
// its work over through the cache).
func NewRuntime(ctx context.Context, cacheDir string, limits Limits, opts ...CacheOption) (*Runtime, error) {
	if cacheDir == "" {
		return NewRuntimeWithCache(ctx, nil, limits)
	}
	cache, err := OpenCache(cacheDir, opts...)
	if err != nil {
		return nil, err
	}
	rt, err := NewRuntimeWithCache(ctx, cache, limits)
	if err != nil {
		return nil, errors.Join(err, cache.Close(ctx))
	}
	rt.owned = true
	return rt, nil
}

// NewRuntimeWithCache is NewRuntime with a cache that other runtimes may
// share (nil for none); the caller closes it after the runtimes.
func NewRuntimeWithCache(ctx context.Context, cache *Cache, limits Limits) (*Runtime, error) {
	limits = limits.WithDefaults()
	cfg := runtimeConfig(limits)
	if cache != nil {
		cfg = cfg.WithCompilationCache(cache.c)
	}
	r := wazero.NewRuntimeWithConfig(ctx, cfg)
	rt := &Runtime{r: r, cache: cache, limits: limits}
	// Go and wasi-libc guests need WASI for their runtimes. Instances get
	// no files, no environment and no network (see Module.Instantiate),
	// and their WASI calls count against HostCallsPerCall.
	if _, err := wasi_snapshot_preview1.Instantiate(experimental.WithFunctionListenerFactory(ctx, wasiCounter{}), r); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("instantiating WASI: %w", err)
	}
	if err := instantiateHostModule(ctx, r); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("instantiating %s: %w", abi.ModuleName, err)
	}
	return rt, nil
}

// runtimeConfig is the wazero configuration of a runtime with limits; a
// compile child uses the same, since wazero's cache key covers some of it
// (WithCloseOnContextDone) and the decoder's checks the rest.
func runtimeConfig(limits Limits) wazero.RuntimeConfig {
	return wazero.NewRuntimeConfig().
		// Reference types bring table.grow and many tables, whose
		// host memory the limits would not see; no guest needs them.
		WithCoreFeatures(api.CoreFeaturesV2 &^ api.CoreFeatureReferenceTypes).
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(limits.MemoryPages)
}

// Limits returns the runtime's limits, with defaults filled in.
func (rt *Runtime) Limits() Limits { return rt.limits }

// Close releases the runtime and every instance made from it.
func (rt *Runtime) Close(ctx context.Context) error {
	err := rt.r.Close(ctx)
	if rt.owned {
		err = errors.Join(err, rt.cache.Close(ctx))
	}
	return err
}
