//go:build linux

// Command emuinit is the /init of the initramfs that scripts/avx512-emu.sh
// boots in an emulated AVX-512 CPU (Bochs): it shows what the guest CPU
// offers, runs gpuhost's test binaries on the AVX-512 GEMM path, prints one
// marker line with the outcome and powers the machine off. The script
// judges the run by that line alone, so that a guest that hangs, panics or
// lacks AVX-512 can never pass.
//
// The initramfs holds /init (this), the test binaries (testBinaries) and
// /emu-args: their arguments, one a line.
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/cpu"
	"golang.org/x/sys/unix"
)

// Marker starts the line that reports the outcome; scripts/avx512-emu.sh
// matches it.
const marker = "AVX512-EMU-RESULT"

// testBinaries are run in turn with the same arguments: the device's
// tests (gpuhost) and its kernels' (gpuhost/internal/cpu).
var testBinaries = []string{"/gpuhost.test", "/cpu.test"}

func main() {
	// The kernel gives an initramfs /init no console when the archive
	// lacks /dev/console, which an unprivileged cpio cannot hold: mount
	// devtmpfs and take the console from there.
	mount("devtmpfs", "/dev", "devtmpfs")
	if f, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := range 3 {
			_ = unix.Dup2(int(f.Fd()), fd)
		}
	}
	mount("proc", "/proc", "proc")
	mount("sysfs", "/sys", "sysfs")
	mount("tmpfs", "/tmp", "tmpfs")

	code, why := run()
	fmt.Printf("%s: exit=%d avx512f=%t %s\n", marker, code, cpu.X86.HasAVX512F, why)
	_ = os.Stdout.Sync()
	unix.Sync()
	// Give the serial line time to drain before the power goes.
	time.Sleep(time.Second)
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Printf("power off: %v\n", err)
	}
	// PID 1 must not exit (the kernel panics); the script stops the
	// emulator once it sees the marker.
	select {}
}

// run reports the guest's CPU and runs the tests: 0 only when the CPU
// has AVX-512F and every test passed. It runs them on any CPU, so that a
// run on one without AVX-512 shows the tests failing by themselves.
func run() (int, string) {
	// The kernel's FPU lines: it turns XSAVE off, and with it every AVX
	// register, when the CPU's XSAVE sizes look inconsistent.
	for _, l := range kernelLog() {
		fmt.Printf("emuinit: kernel: %s\n", l)
	}
	flags := cpuFlags()
	fmt.Printf("emuinit: /proc/cpuinfo avx512 flags: %s\n", strings.Join(flags, " "))
	fmt.Printf("emuinit: x/sys/cpu: AVX2=%t FMA=%t AVX512F=%t OSXSAVE=%t\n",
		cpu.X86.HasAVX2, cpu.X86.HasFMA, cpu.X86.HasAVX512F, cpu.X86.HasOSXSAVE)
	args, err := readArgs("/emu-args")
	if err != nil {
		return 3, err.Error()
	}
	start := time.Now()
	for _, bin := range testBinaries {
		fmt.Printf("emuinit: %s %s\n", bin, strings.Join(args, " "))
		cmd := exec.Command(bin, args...)
		cmd.Dir = "/tmp"
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		// A fixed environment, not this init's (whatever the kernel
		// passed): the test binaries read the path they are to cover.
		cmd.Env = []string{"PATH=/bin:/usr/bin", "HOME=/tmp", "TMPDIR=/tmp", "MOEHOST_GEMM=avx512"}
		err = cmd.Run()
		took := fmt.Sprintf("tests took %s (guest clock)", time.Since(start).Round(time.Second))
		switch {
		case err != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() > 0:
			return cmd.ProcessState.ExitCode(), fmt.Sprintf("%s failed; %s", bin, took)
		case err != nil:
			return 4, fmt.Sprintf("%s: %v; %s", bin, err, took)
		}
	}
	took := fmt.Sprintf("tests took %s (guest clock)", time.Since(start).Round(time.Second))
	switch {
	case !cpu.X86.HasAVX512F:
		// The tests ran anyway, so that a run shows what they do on a
		// CPU without AVX-512 (TestGemmPathFromEnv fails them).
		return 2, "the tests passed, but the guest CPU lacks AVX-512F (or the kernel does not save ZMM state); " + took
	}
	return 0, took
}

// cpuFlags returns the avx512 flags of the first CPU in /proc/cpuinfo.
func cpuFlags() []string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) != "flags" {
			continue
		}
		for _, fl := range strings.Fields(val) {
			if strings.HasPrefix(fl, "avx512") {
				out = append(out, fl)
			}
		}
		break
	}
	return out
}

// kernelLog returns the kernel log's lines about the FPU and XSAVE.
func kernelLog() []string {
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return []string{fmt.Sprintf("reading the kernel log: %v", err)}
	}
	var out []string
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		if low := strings.ToLower(l); strings.Contains(low, "fpu") || strings.Contains(low, "xsave") || strings.Contains(low, "xstate") {
			out = append(out, l)
		}
	}
	return out
}

// readArgs reads one argument a line, skipping empty lines.
func readArgs(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the test arguments: %w", err)
	}
	var args []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			args = append(args, l)
		}
	}
	return args, nil
}

func mount(src, target, fstype string) {
	_ = os.MkdirAll(target, 0o755)
	if err := unix.Mount(src, target, fstype, 0, ""); err != nil {
		fmt.Fprintf(os.Stderr, "emuinit: mount %s: %v\n", target, err)
	}
}
