package experts

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/checkpoint"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/internal/expertlimits"
	"github.com/moehost/moehost/modules"
	"github.com/moehost/moehost/sdk/swarm"
)

// Spec describes one expert to host.
type Spec struct {
	// UID names the expert, e.g. "ffn.3". Required and unique.
	UID string
	// Module is the expert's code.
	Module ModuleSource
	// Config holds the expert's integer settings, read by the module's
	// moe_init (e.g. "hidden_dim").
	Config map[string]int64
	// Batching overrides the server's batch limits for this expert.
	Batching *batch.Limits
	// Optimizer overrides the server's optimizer for this expert.
	Optimizer *gpuhost.OptimizerConfig
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
	Limits *expertlimits.Limits
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

// buildOptimizer checks o and makes its optimizer.
func buildOptimizer(o gpuhost.OptimizerConfig) (gpuhost.Optimizer, error) {
	if err := ValidateOptimizer(o); err != nil {
		return nil, err
	}
	return gpuhost.NewOptimizer(o.WithDefaults()), nil
}

// ValidateOptimizer reports a bad setting without the kernels' error
// prefix.
func ValidateOptimizer(o gpuhost.OptimizerConfig) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("optimizer: %s", strings.TrimPrefix(err.Error(), gpuhost.ErrArgument.Error()+": "))
	}
	return nil
}

// Validate checks one expert's config; withCheckpoints adds the checks
// that its uid be usable as a checkpoint directory.
func (e Spec) Validate(withCheckpoints bool) error {
	if e.UID == "" {
		return errors.New("an expert has no uid")
	}
	if len(e.UID) > swarm.MaxNameLen {
		return fmt.Errorf("uid %.40q… is %d bytes, more than %d", e.UID, len(e.UID), swarm.MaxNameLen)
	}
	// The one uid grammar, the swarm's: a uid the swarm could not find is
	// refused here rather than served unreachable. Each part is checked
	// first, so that the error names a bad character.
	for part := range strings.SplitSeq(e.UID, ".") {
		if err := swarm.CheckNamePart(part); err != nil {
			return fmt.Errorf("expert %q: %w", e.UID, err)
		}
	}
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
		if err := ValidateOptimizer(*e.Optimizer); err != nil {
			return fmt.Errorf("expert %q: %w", e.UID, err)
		}
	}
	if withCheckpoints {
		if err := checkpoint.CheckDirName(e.UID); err != nil {
			return err
		}
	}
	return nil
}

// ConfigString renders an expert config as sorted key=value pairs.
func ConfigString(c map[string]int64) string {
	parts := make([]string, 0, len(c))
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ",")
}
