#!/usr/bin/env bash
# device-run.sh runs the device check that scripts/device-check.sh built
# (in .tmp/device-check), on the GPU machine through the device tool:
#
#   1. gpuhost's tests: the device table, with the CUDA device (cuda-0)
#      beside the CPU, every op's outputs and gradients against float64
#      references and the CPU device, on fresh random inputs;
#   2. the driver's tests and its GEMM benchmark at the ffn's shapes;
#   3. the ffn benchmark (host's BenchmarkDeviceFFN): forward and
#      forward+backward+Adam at hidden 1024, batch 4096, on cuda:0;
#   4. scripts/torch_cuda_peer.py: PyTorch at the same shapes, TF32 off,
#      and one table of both with the ratios.
#
# Each step has its own time limit, about four minutes in all; a step
# that fails is reported and the next one runs. Logs and the table go to
# $OUT (the device tool's), else .tmp/device-check/out. It exits non-zero
# if any step failed.
#
# --small runs the emulator build (GOFLAGS=-tags=cudaemu
# scripts/device-check.sh) here at small sizes, without PyTorch.
set -uo pipefail
cd "$(dirname "$0")/.."

dir=.tmp/device-check
out=${OUT:-$dir/out}
small=0
[ "${1:-}" = --small ] && small=1
mkdir -p "$out"
if [ ! -x "$dir/gpuhost.test" ]; then
	echo "device-run: no $dir/gpuhost.test: run scripts/device-check.sh first (and carry $dir)" >&2
	exit 2
fi
echo "device-run: binaries built with -tags $(cat "$dir/tags") at $(cat "$dir/commit" 2>/dev/null)" | tee "$out/summary.txt"

hidden=1024 batch=4096 shapes=4096x4096x1024:NT,4096x1024x4096:NT,4096x1024x4096:TN
gemm_iters=30x ffn_iters=10x
if [ $small = 1 ]; then
	hidden=32 batch=64 shapes=64x48x32:NT,64x48x32:TN gemm_iters=3x ffn_iters=2x
else
	# The driver's libcuda.so.1, where the loader does not find it.
	if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
		for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
			[ -e "$d/libcuda.so.1" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
		done
	fi
	# cuBLAS: the loader's, else PyTorch's wheel's, else a toolkit's.
	if [ -z "${MOEHOST_CUBLAS:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[123] '; then
		# PyTorch's wheels: CUDA 12's put it in nvidia/cublas/lib, CUDA
		# 13's in nvidia/cu13/lib; look through the whole namespace.
		cands=$(python3 -c '
import glob, os, nvidia
for p in nvidia.__path__:
    for f in sorted(glob.glob(os.path.join(p, "**", "libcublas.so.1[123]"), recursive=True)):
        print(os.path.dirname(f))
' 2>/dev/null | awk '!seen[$0]++' || true)
		for d in $cands /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/x86_64-linux/lib; do
			f=$(ls "$d"/libcublas.so.1[321] 2>/dev/null | sort -r | head -1)
			if [ -n "$f" ]; then
				export MOEHOST_CUBLAS=$f LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
				break
			fi
		done
	fi
	if [ -z "${MOEHOST_CUBLAS:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[123] '; then
		# Every CUDA step would fail on it: say so once, and list what is there.
		echo "cuBLAS: NOT FOUND (no libcublas.so.1[123] from the loader, PyTorch's wheels or /usr/local/cuda*); set MOEHOST_CUBLAS" | tee -a "$out/summary.txt"
		timeout 20 find / -xdev -name 'libcublas.so*' 2>/dev/null | head -20 | tee -a "$out/summary.txt"
		exit 1
	fi
	echo "cuBLAS: ${MOEHOST_CUBLAS:-found by the loader}; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" | tee -a "$out/summary.txt"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$out/summary.txt"
fi

failed=0
step() { # step NAME SECONDS LOG CMD...
	local name=$1 secs=$2 log=$3
	shift 3
	local start=$SECONDS
	timeout -k 5 "$secs" "$@" >"$out/$log" 2>&1
	local rc=$?
	local line="$name: $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - start))s, log $log"
	echo "$line" | tee -a "$out/summary.txt"
	if [ $rc != 0 ]; then
		failed=1
		grep -E -- '--- FAIL|^panic|FAIL|Error|error' "$out/$log" | head -20
	fi
}

step "device table (gpuhost tests)" 100 gpuhost.txt \
	"$dir/gpuhost.test" -test.count=1 -test.timeout=95s -test.v
echo "  the CUDA device's cases: $(grep -c -- '--- PASS: .*cuda-0' "$out/gpuhost.txt") passed, $(grep -c -- '--- FAIL: .*cuda-0' "$out/gpuhost.txt") failed" | tee -a "$out/summary.txt"
step "driver tests and GEMM benchmark" 40 driver.txt \
	"$dir/cuda.test" -test.count=1 -test.timeout=35s -test.run=TestDriver -test.bench=Sgemm \
	-test.benchtime=$gemm_iters -gemm.shapes=$shapes
gunzip -c "$dir/host.test.gz" >/tmp/moehost-host.test && chmod +x /tmp/moehost-host.test
step "ffn benchmark on cuda:0" 80 ffn.txt \
	/tmp/moehost-host.test -test.count=1 -test.timeout=75s -test.run='^$' -test.bench=DeviceFFN \
	-test.benchtime=$ffn_iters -bench.device=cuda:0 -bench.hidden=$hidden -bench.batch=$batch
grep -h '^Benchmark' "$out/driver.txt" "$out/ffn.txt" | tee "$out/bench.txt"
if [ $small = 0 ]; then
	PYTHONUNBUFFERED=1 step "PyTorch peer and table" 60 table.md \
		python3 scripts/torch_cuda_peer.py --ours "$out/bench.txt" --json "$out/table.json" \
		--shapes "$shapes" --hidden $hidden --batch $batch
	cat "$out/table.md"
fi
echo "device-run: $([ $failed = 0 ] && echo all steps passed || echo some steps FAILED)" | tee -a "$out/summary.txt"
exit $failed
