package host

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/moehost/moehost/gpuhost"
)

// errNoCUDA is what a binary built without the cuda tag says to a CUDA
// device spec.
var errNoCUDA = errors.New("built without CUDA support; rebuild with make build-cuda")

// maxGPUs bounds the ordinals of one device spec.
const maxGPUs = 64

// WithDevice sets the devices the experts run on:
//
//   - "cpu" (the default): the CPU device;
//   - "cuda" or "cuda:N": GPU N (0 for "cuda");
//   - "cuda:N,M,...": several GPUs, each with its own worker. Experts are
//     assigned round-robin (each new expert goes to the GPU with the
//     fewest), and an expert's instance, parameters, optimizer state and
//     batches all stay on its GPU.
//
// A binary built without the cuda (or cudaemu) build tag refuses a CUDA
// spec in New. Each GPU's live tensors are bounded by its own memory (an
// allocation it refuses is ErrOutOfMemory, ResourceExhausted at the edge);
// WithMemoryLimit bounds host memory (the Go runtime's soft limit) and
// the CPU device's tensors, not GPU memory.
func WithDevice(spec string) Option {
	return optionFunc(func(c *config) { c.device = spec })
}

// WithDeviceOptions adds options to every device the server opens, after
// its own (the memory ceiling and the server's logger): a GEMM path, where
// cuBLAS is, an emulator's GPUs. gpuhost reads no environment, so that
// tests, benchmarks and cmd/ choose them here. Default: none.
func WithDeviceOptions(opts ...gpuhost.DeviceOption) Option {
	return optionFunc(func(c *config) { c.deviceOpts = append(c.deviceOpts, opts...) })
}

// deviceSpec is a parsed WithDevice spec: no ordinals is the CPU.
type deviceSpec struct {
	gpus []int
}

// parseDeviceSpec parses a WithDevice spec ("" is "cpu").
func parseDeviceSpec(spec string) (deviceSpec, error) {
	s := strings.TrimSpace(spec)
	if s == "" || s == "cpu" {
		return deviceSpec{}, nil
	}
	if s == "cuda" {
		s = "cuda:0"
	}
	list, ok := strings.CutPrefix(s, "cuda:")
	if !ok {
		return deviceSpec{}, fmt.Errorf("device %q: want cpu, cuda, cuda:N or a list cuda:N,M", spec)
	}
	var ds deviceSpec
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n >= maxGPUs {
			return deviceSpec{}, fmt.Errorf("device %q: %q is not a GPU ordinal (0 to %d)", spec, f, maxGPUs-1)
		}
		if slices.Contains(ds.gpus, n) {
			return deviceSpec{}, fmt.Errorf("device %q: GPU %d is listed twice", spec, n)
		}
		ds.gpus = append(ds.gpus, n)
	}
	return ds, nil
}

// validateDevice checks the WithDevice spec, and that this binary can
// open what it names.
func (c *config) validateDevice() error {
	ds, err := parseDeviceSpec(c.device)
	if err != nil {
		return err
	}
	if len(ds.gpus) > 0 && !cudaBuilt {
		return errNoCUDA
	}
	return nil
}

// openDevices opens the devices of the WithDevice spec: the CPU under
// limit (0: none), the ceiling on live tensor bytes, or the GPUs, each
// bounded by its own memory.
func (s *Server) openDevices(limit int64) ([]gpuhost.Device, error) {
	ds, err := parseDeviceSpec(s.cfg.device)
	if err != nil {
		return nil, err
	}
	opts := append([]gpuhost.DeviceOption{gpuhost.WithLogger(s.cfg.logger)}, s.cfg.deviceOpts...)
	if len(ds.gpus) == 0 {
		cpuOpts := []gpuhost.DeviceOption{gpuhost.WithCeiling(gpuhost.NewCeiling(limit))}
		if s.cfg.memoryLimit >= 0 {
			cpuOpts = append(cpuOpts, gpuhost.WithOnIdle(freeOSMemory))
		}
		return []gpuhost.Device{gpuhost.NewCPU(kernelThreads(), append(cpuOpts, opts...)...)}, nil
	}
	var devs []gpuhost.Device
	for _, n := range ds.gpus {
		d, err := openCUDA(n, opts...)
		if err != nil {
			closeDevices(devs)
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// closeDevices closes the devices that hold resources beyond Go memory
// (a GPU's context); the CPU device has nothing to close.
func closeDevices(devs []gpuhost.Device) error {
	var errs []error
	for _, d := range devs {
		if c, ok := d.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// deviceNames lists devices' names for the startup log line.
func deviceNames(devs []gpuhost.Device) string {
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name()
	}
	return strings.Join(names, ",")
}
