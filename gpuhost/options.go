package gpuhost

import "log/slog"

// DeviceOption configures a device built by [NewCPU] or [NewCUDA]. An
// option that does not apply to a device is ignored by it. Devices read
// no environment variable: tests, benchmarks and cmd/ pick kernels,
// libraries and emulated GPUs through these options.
type DeviceOption interface {
	applyDevice(*deviceConfig)
}

// deviceConfig is what the options set; its zero value is the defaults.
type deviceConfig struct {
	ceiling *Ceiling
	// gemm names the CPU's GEMM path ("" is the best one).
	gemm   string
	logger *slog.Logger
	// cublas lists files and directories to look for cuBLAS in first.
	cublas []string
	// emuDevices and emuMem are the CUDA emulator's device count and
	// memory in bytes (0: its defaults).
	emuDevices int
	emuMem     int64
	// onIdle runs when a CPU device's pool has emptied by decay.
	onIdle func()
}

// log returns the configured logger, or one that discards.
func (c *deviceConfig) log() *slog.Logger {
	if c.logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.logger
}

// newDeviceConfig applies the tests' defaults (testOptions), then opts.
func newDeviceConfig(opts []DeviceOption) deviceConfig {
	var cfg deviceConfig
	for _, o := range append(testOptions[:len(testOptions):len(testOptions)], opts...) {
		o.applyDevice(&cfg)
	}
	return cfg
}

// testOptions are applied before a caller's options. It is empty in a
// server; gpuhost's test binary sets it once, before any test runs, from
// MOEHOST_GEMM (export_test.go), so that one run covers one path in
// every test, the external ones included.
var testOptions []DeviceOption

type deviceOptionFunc func(*deviceConfig)

func (f deviceOptionFunc) applyDevice(c *deviceConfig) { f(c) }

// WithCeiling makes the device refuse, with [ErrOutOfMemory], any
// allocation that would push the live tensor bytes of all devices sharing
// c past its limit. Default: no ceiling.
func WithCeiling(c *Ceiling) DeviceOption {
	return deviceOptionFunc(func(dc *deviceConfig) { dc.ceiling = c })
}

// WithGEMMPath makes a CPU device run the named GEMM path, "avx512",
// "avx2" or "go" (any case), and the elementwise kernels of its width,
// instead of the best one this CPU and build run, so that tests cover
// every path and benchmarks compare them. A name the CPU or build lacks
// gives the best path and a warning through [WithLogger]'s logger; an
// AVX-512 kernel that fails its first-use check gives AVX2, as without
// the option. Default: "", the best path.
func WithGEMMPath(name string) DeviceOption {
	return deviceOptionFunc(func(dc *deviceConfig) { dc.gemm = name })
}

// WithLogger sets the logger a device warns through, of a fallback to
// another GEMM path for one. Default: discard.
func WithLogger(l *slog.Logger) DeviceOption {
	return deviceOptionFunc(func(dc *deviceConfig) { dc.logger = l })
}

// WithOnIdle makes a CPU device call f each time its pool has given all
// its storage back by decay: two [PoolDecay] periods passed without a
// release that it kept, so the device is idle. f runs on the decay
// timer's goroutine, after the storage is gone; the host gives the Go
// runtime's free memory back to the operating system there. CUDA devices
// ignore it. Default: none.
func WithOnIdle(f func()) DeviceOption {
	return deviceOptionFunc(func(dc *deviceConfig) { dc.onIdle = f })
}

// WithCUBLAS lists where a CUDA device looks for cuBLAS before the
// dynamic loader's own search (LD_LIBRARY_PATH, the ld.so cache): each is
// the library's file, or a directory that holds one of its sonames. The
// first CUDA device of a process loads it, and later ones share it, so
// only the first one's list counts. Default: the loader's search alone.
func WithCUBLAS(paths ...string) DeviceOption {
	return deviceOptionFunc(func(dc *deviceConfig) { dc.cublas = append([]string(nil), paths...) })
}

// WithEmulatedGPUs sets how many GPUs the CUDA emulator (the cudaemu
// build tag) has, and the bytes of memory of each, so that tests can
// open several and run one out of memory; other builds ignore it.
// Defaults: 1 GPU and 4 GiB; n <= 0 or mem <= 0 keeps a default.
func WithEmulatedGPUs(n int, mem int64) DeviceOption {
	return deviceOptionFunc(func(dc *deviceConfig) {
		if n > 0 {
			dc.emuDevices = n
		}
		if mem > 0 {
			dc.emuMem = mem
		}
	})
}
