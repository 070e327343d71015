#!/usr/bin/env bash
# avx512-emu.sh runs gpuhost's GEMM and row-kernel tests on the AVX-512
# path in an emulated AVX-512 CPU, for machines without one (make test-avx512-emu).
#
# Bochs (Debian's build has the EVEX decoder and the corei7_skylake_x
# model) boots Debian's kernel from a small ISO whose initramfs holds
# gpuhost/internal/emuinit as /init and the test binaries of gpuhost and
# gpuhost/internal/cpu (its kernels). init prints
# the guest's AVX-512 flags, runs the tests with MOEHOST_GEMM=avx512 and
# prints one line, "AVX512-EMU-RESULT: exit=N avx512f=B ...", then powers
# off. The script passes only on exit=0 and avx512f=true, and the tests
# themselves fail when MOEHOST_GEMM names a path the CPU lacks
# (TestGemmPathFromEnv), so a guest without AVX-512 can never pass.
#
# Environment:
#   AVX512_EMU_CPU      Bochs CPU model (default corei7_skylake_x; e.g.
#                       corei7_haswell_4770, an AVX2-only CPU, must fail)
#   AVX512_EMU_RUN      the tests' -test.run pattern (default: the GEMM
#                       and row-kernel tests that run every path, each
#                       failing when the AVX-512 one did not run);
#                       AVX512_EMU_SKIP a -test.skip pattern
#   AVX512_EMU_TIMEOUT  seconds before the emulator is stopped (default 1500)
#
# Work files (the kernel .deb, the ISO, the serial log) live in
# .tmp/avx512-emu; the kernel is downloaded once. Needs root or sudo for
# apt-get when a package is missing.
set -euo pipefail

name=avx512-emu
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/.tmp/avx512-emu
cpu=${AVX512_EMU_CPU:-corei7_skylake_x}
run=${AVX512_EMU_RUN:-'^(TestGemmPathFromEnv|TestCheckAgainstGo|TestGemmBias|TestGemmGeluEpilogue|TestGemmMatchesNaive|TestDotTilesMatchBuffered|TestGeluKernels|TestAdamKernels|TestLayerNormKernels|TestSoftmaxKernels|TestResidualAddKernels)$'}
skip=${AVX512_EMU_SKIP:-}
limit=${AVX512_EMU_TIMEOUT:-1500}
GO=${GO:-go}

"$root/scripts/apt-install.sh" "$name" bochs bochs-term bochsbios vgabios isolinux syslinux-common xorriso cpio

mkdir -p "$work"
cd "$work"

# Debian's current kernel, once: the metapackage names the version.
if ! ls boot/vmlinuz-* >/dev/null 2>&1; then
	kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
	pkg=$(kernel_pkg)
	if [ -z "$pkg" ]; then
		# Package lists never fetched (a fresh container, say).
		sudo=()
		[ "$(id -u)" -eq 0 ] || sudo=(sudo)
		"${sudo[@]}" apt-get update
		pkg=$(kernel_pkg)
	fi
	if [ -z "$pkg" ]; then
		echo "$name: apt knows no linux-image-amd64" >&2
		exit 1
	fi
	echo "$name: downloading $pkg"
	rm -f linux-image-*.deb
	apt-get download "$pkg"
	dpkg-deb --fsys-tarfile linux-image-*.deb | tar -x --wildcards './boot/vmlinuz-*'
	rm -f linux-image-*.deb
fi
vmlinuz=$(ls boot/vmlinuz-* | head -n1)

echo "$name: building the test binary and /init"
rm -rf initramfs iso
mkdir -p initramfs iso/isolinux
(cd "$root" && CGO_ENABLED=0 "$GO" build -o "$work/initramfs/init" ./gpuhost/internal/emuinit)
(cd "$root" && CGO_ENABLED=0 "$GO" test -c -ldflags=-s -o "$work/initramfs/gpuhost.test" ./gpuhost/)
(cd "$root" && CGO_ENABLED=0 "$GO" test -c -ldflags=-s -o "$work/initramfs/cpu.test" ./gpuhost/internal/cpu/)
# -test.short: the largest products of TestGemmMatchesNaive take minutes
# each in the emulator, and every path runs every shape.
printf '%s\n' -test.v -test.short -test.count=1 "-test.run=$run" ${skip:+"-test.skip=$skip"} >initramfs/emu-args
(cd initramfs && find . | cpio -o -H newc --quiet | gzip -6) >iso/initrd.gz
cp "$vmlinuz" iso/vmlinuz
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 iso/isolinux/
# clearcpuid=xsaves,xsavec: Bochs 2.7 reports the standard-format size in
# CPUID(0xD,1).EBX, where the compacted size belongs, and Linux then turns
# XSAVE off, and with it AVX and AVX-512. Without compaction the kernel
# uses the standard format, whose sizes Bochs reports right.
# mitigations=off, audit=0, nowatchdog: a guest that runs one test binary
# needs none of them, and without them it booted and ran the tests in 319
# seconds of Bochs rather than 394.
cat >iso/isolinux/isolinux.cfg <<EOF
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  APPEND initrd=/initrd.gz console=ttyS0,115200 quiet panic=-1 lpj=1000000 mitigations=off audit=0 nowatchdog clearcpuid=xsaves,xsavec
EOF
xorriso -as mkisofs -quiet -o boot.iso -b isolinux/isolinux.bin -c isolinux/boot.cat \
	-no-emul-boot -boot-load-size 4 -boot-info-table iso 2>/dev/null

# Debian's Bochs has no "nogui" display: the VNC one, waiting for no
# client, is the headless one it has. It is built with its debugger,
# which the -rc file tells to continue at once and to quit at the end.
cat >bochsrc <<EOF
plugin_ctrl: speaker=0, parallel=0, gameport=0, iodebug=0, extfpuirq=0, serial=1
config_interface: textconfig
display_library: rfb, options="timeout=0"
memory: guest=512, host=512
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/vgabios/vgabios.bin
cpu: model=$cpu, count=1, ips=50000000, reset_on_triple_fault=0
pci: enabled=1, chipset=i440fx
ata0: enabled=1, ioaddr1=0x1f0, ioaddr2=0x3f0, irq=14
ata0-master: type=cdrom, path=boot.iso, status=inserted
ata1: enabled=0
boot: cdrom
clock: sync=none, time0=local
com1: enabled=1, mode=file, dev=serial.log
log: bochs.log
panic: action=fatal
error: action=report
info: action=ignore
debug: action=ignore
EOF
printf 'continue\nquit\n' >debugger.rc

echo "$name: booting Bochs ($cpu); the guest's console follows (also in $work/serial.log)"
rm -f serial.log bochs.log
start=$(date +%s)
bochs -q -f bochsrc -rc debugger.rc </dev/null >bochs.out 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
# Stream the console as it grows; stop at the time limit, or shortly
# after the result line if the power-off does not end Bochs.
shown=0 now=0 booted='' ended='' timed_out=''
while kill -0 "$pid" 2>/dev/null; do
	now=$(($(date +%s) - start))
	if [ -f serial.log ]; then
		size=$(stat -c %s serial.log)
		if [ "$size" -gt "$shown" ]; then
			tail -c +$((shown + 1)) serial.log | head -c $((size - shown))
			shown=$size
		fi
		if [ -z "$booted" ] && grep -qa '^emuinit: ' serial.log; then
			booted=$now
			echo "$name: the guest started /init after ${booted}s"
		fi
		if [ -z "$ended" ] && grep -qa '^AVX512-EMU-RESULT: ' serial.log; then
			ended=$now
		fi
	fi
	if [ -n "$ended" ] && [ $((now - ended)) -gt 30 ]; then
		break
	fi
	if [ "$now" -ge "$limit" ]; then
		timed_out=1
		break
	fi
	sleep 2
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
trap - EXIT
if [ -f serial.log ]; then
	tail -c +$((shown + 1)) serial.log
fi
if [ -n "$booted" ]; then
	boot="after ${booted}s"
elif grep -qa '^emuinit: ' serial.log 2>/dev/null; then
	boot="within ${now}s"
else
	boot=never
fi
echo "$name: Bochs ran $(($(date +%s) - start))s; the guest started /init $boot"
if [ -n "$timed_out" ]; then
	echo "$name: FAIL: no result within ${limit}s" >&2
	exit 1
fi
result=$(grep -a '^AVX512-EMU-RESULT: ' serial.log 2>/dev/null | tail -n1 || true)
if [ -z "$result" ]; then
	echo "$name: FAIL: the guest printed no result line; the emulator's log:" >&2
	tail -n 40 bochs.out >&2
	exit 1
fi
case $result in
"AVX512-EMU-RESULT: exit=0 avx512f=true "*)
	echo "$name: PASS on $cpu"
	;;
*)
	echo "$name: FAIL on $cpu: $result" >&2
	exit 1
	;;
esac
