package cli

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/moehost/moehost/host"
)

// moduleLimitFlags are serve's flags for the limits every module must
// pass before it is compiled (host.GuestLimits' Module), whether it is
// given with --module or uploaded by a tenant. Each defaults to the
// library's default; 0 or less is refused, since to the library 0 means
// "the default" and a negative limit refuses every module.
type moduleLimitFlags struct {
	ints    []intLimit
	bytes   *int64
	timeout *time.Duration
}

type intLimit struct {
	name string
	v    *int
}

// register binds the flags to l's fields, with the defaults as values.
func (m *moduleLimitFlags) register(f *pflag.FlagSet, l *host.ModuleLimits) {
	*l = host.GuestLimits{}.WithDefaults().Module
	for _, d := range []struct {
		name  string
		v     *int
		usage string
	}{
		{"module-bytes", &l.Bytes, "largest module in bytes that an expert may run (a tenant's upload is also capped by --max-upload-bytes)"},
		{"module-code-bytes", &l.CodeBytes, "largest code section of a module in bytes"},
		{"module-functions", &l.Functions, "most functions a module may import and define"},
		{"module-locals-per-function", &l.LocalsPerFunction, "most locals one function of a module may declare"},
		{"module-locals", &l.Locals, "most locals all functions of a module may declare together"},
		{"module-function-body-bytes", &l.FunctionBodyBytes, "largest function body of a module in bytes"},
		{"module-nesting-depth", &l.NestingDepth, "deepest nesting of blocks, loops and ifs in one function"},
		{"module-nesting-work", &l.NestingWork, "largest sum over a module's blocks, loops and ifs of their nesting depth (what compile time grows with)"},
		{"module-br-table-targets", &l.BrTableTargets, "most targets of one br_table"},
		{"module-br-table-targets-total", &l.BrTableTargetsTotal, "most targets of all br_tables of a module together"},
		{"module-data-bytes", &l.DataBytes, "most bytes of all data segments of a module together"},
		{"module-data-segments", &l.DataSegments, "most data segments of a module"},
		{"module-element-entries", &l.ElementEntries, "most entries of all element segments of a module together"},
	} {
		f.IntVar(d.v, d.name, *d.v, d.usage)
		m.ints = append(m.ints, intLimit{d.name, d.v})
	}
	f.Int64Var(&l.CompileBytes, "module-compile-bytes", l.CompileBytes, "most memory one compile may take, as the module's shape bounds it; a module that would cost more is refused")
	f.DurationVar(&l.CompileTimeout, "module-compile-timeout", l.CompileTimeout, "longest one module's compile may run (in a child process) before it is stopped and the module refused")
	m.bytes, m.timeout = &l.CompileBytes, &l.CompileTimeout
}

// check refuses a limit of 0 or less, naming its flag.
func (m *moduleLimitFlags) check() error {
	for _, l := range m.ints {
		if *l.v <= 0 {
			return fmt.Errorf("--%s %d: must be positive", l.name, *l.v)
		}
	}
	if *m.bytes <= 0 {
		return fmt.Errorf("--module-compile-bytes %d: must be positive", *m.bytes)
	}
	if *m.timeout <= 0 {
		return fmt.Errorf("--module-compile-timeout %v: must be positive", *m.timeout)
	}
	return nil
}
