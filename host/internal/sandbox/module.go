package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/modules"
)

// Module is a compiled expert module.
type Module struct {
	rt       *Runtime
	compiled wazero.CompiledModule
	digest   string
}

// Digest returns "sha256:" and the hex digest of the module's bytes.
func (m *Module) Digest() string { return m.digest }

// Compile validates and compiles a module. It fails with ErrInvalidModule
// when the bytes are not Wasm, import anything but the ABI and WASI, or
// lack a required export.
func (rt *Runtime) Compile(ctx context.Context, wasm []byte) (*Module, error) {
	digest := modules.Digest(wasm)
	if len(wasm) > rt.limits.Module.Bytes {
		return nil, fmt.Errorf("%w %s: module bytes: %d, the limit is %d", ErrInvalidModule, digest, len(wasm), rt.limits.Module.Bytes)
	}
	shape, err := inspect(wasm)
	if err == nil {
		err = shape.check(rt.limits.Module)
	}
	if err == nil {
		err = shape.checkImports()
	}
	if err == nil {
		err = shape.checkCommand()
	}
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidModule, digest, err)
	}
	var cm wazero.CompiledModule
	compiling.Lock()
	lowPriority(ctx, 0, func(ctx context.Context) {
		// A child compiles into the file cache, so that the compile
		// below only reads the machine code back.
		if err = rt.compileInChild(ctx, wasm, shape, digest); err == nil {
			cm, err = rt.r.CompileModule(ctx, wasm)
		}
	})
	compiling.Unlock()
	if err != nil {
		if errors.Is(err, errChildStart) {
			return nil, fmt.Errorf("compiling %s: %w", digest, err)
		}
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidModule, digest, err)
	}
	if err := validate(cm); err != nil {
		cm.Close(ctx)
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidModule, digest, err)
	}
	if rt.cache != nil {
		// The next compile of it skips the child; failing to say so
		// costs that compile only its child.
		_ = writeReceipt(rt.cache.dir, digest)
	}
	return &Module{rt: rt, compiled: cm, digest: digest}, nil
}

// compiling serialises compiles in the process, so that the memory they
// take together is bounded by one module's ModuleLimits.CompileBytes (each
// module's compileCost was checked against it), and so that compiles take
// one core at most from the kernels of other tenants' calls, at the
// lowest priority (lowPriority).
var compiling sync.Mutex

// validate checks the module's imports and exports against ABI v1.
func validate(cm wazero.CompiledModule) error {
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		switch mod {
		case abi.ModuleName:
			if !slices.Contains(hostFuncNames, name) {
				return fmt.Errorf("imports unknown host function %s.%s", mod, name)
			}
		case "wasi_snapshot_preview1":
		default:
			return fmt.Errorf("imports from module %q; only %q and WASI are allowed", mod, abi.ModuleName)
		}
	}
	exports := cm.ExportedFunctions()
	for _, name := range []string{abi.ExportABIVersion, abi.ExportInit, abi.ExportForward} {
		f, ok := exports[name]
		if !ok {
			return fmt.Errorf("missing export %q", name)
		}
		if len(f.ParamTypes()) != 0 || !slices.Equal(f.ResultTypes(), []api.ValueType{api.ValueTypeI32}) {
			return fmt.Errorf("export %q must have type () -> i32", name)
		}
	}
	if f, ok := exports[abi.ExportInitialize]; ok && (len(f.ParamTypes()) != 0 || len(f.ResultTypes()) != 0) {
		return fmt.Errorf("export %q must have type () -> ()", abi.ExportInitialize)
	}
	if f, ok := exports[abi.ExportBackward]; ok && (len(f.ParamTypes()) != 0 || !slices.Equal(f.ResultTypes(), []api.ValueType{api.ValueTypeI32})) {
		return fmt.Errorf("export %q must have type () -> i32", abi.ExportBackward)
	}
	if _, ok := exports["_start"]; ok {
		if _, ok := exports[abi.ExportInitialize]; !ok {
			// A WASI command's exports trap before _start; an expert
			// must be a reactor, which the host initialises itself.
			return errWASICommand
		}
	}
	if _, ok := cm.ExportedMemories()[abi.ExportMemory]; !ok {
		return fmt.Errorf("missing exported memory %q", abi.ExportMemory)
	}
	return nil
}

// Close releases the compiled code.
func (m *Module) Close(ctx context.Context) error { return m.compiled.Close(ctx) }
