package cli

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/spf13/pflag"
)

// profileFlags are serve's hidden --cpuprofile and --memprofile, for
// `moehost bench --child --server-profile`: pprof is never served over
// the network, only written to files the operator names.
type profileFlags struct {
	cpu, mem string
}

func (p *profileFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.cpu, "cpuprofile", "", "write a CPU profile of the server to this file until it stops")
	f.StringVar(&p.mem, "memprofile", "", "write an allocation profile (pprof allocs) of the server to this file when it stops")
	_ = f.MarkHidden("cpuprofile")
	_ = f.MarkHidden("memprofile")
}

// start begins the CPU profile; stop ends it and writes the allocation
// profile.
func (p profileFlags) start() (stop func() error, err error) {
	stopCPU := func() {}
	if p.cpu != "" {
		if stopCPU, err = startCPUProfile(p.cpu); err != nil {
			return nil, fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	return func() error {
		stopCPU()
		if p.mem == "" {
			return nil
		}
		f, err := os.Create(p.mem)
		if err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
		runtime.GC() // up-to-date statistics
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
		return nil
	}, nil
}
