# moehost. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules --warn-undefined-variables

GO ?= go
BIN := $(CURDIR)/.tmp/bin
# Pinned tools, built from the Go module proxy on first use.
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_CONNECT_GO_VERSION := v1.21.1
STATICCHECK_VERSION := v0.8.2
# Stamped into the binary (moehost version, GetServerInfo), so that a build
# without Go's VCS stamping still names its version and commit.
VERSION ?= $(shell git describe --tags --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell c=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null && echo $$c || echo $$c+dirty; })
GO_LDFLAGS := -X github.com/moehost/moehost/host.stampedVersion=$(VERSION) -X github.com/moehost/moehost/host.stampedCommit=$(COMMIT)
# apt-get needs root; others go through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Guest experts: reproducible builds, so the committed .wasm files match
# (-buildvcs=false: a checkout's git metadata would stamp each build with
# its commit, so that every commit changed them).
WASM_FLAGS := -trimpath -buildvcs=false -ldflags='-s -w -buildid=' -buildmode=c-shared
EXAMPLES := $(patsubst %/main.go,%,$(wildcard examples/wasm-experts/*/main.go))
# C guest experts: Debian's clang, lld, wasi-libc and wasm32 builtins
# (scripts/install-c-wasm-toolchain.sh). Each directory with .c files builds
# into <dir>/<dir>.wasm, a WASI reactor; the output is reproducible.
WASM_CC ?= clang
C_WASM_FLAGS := --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -Werror -Wl,--strip-debug
C_EXAMPLES := $(sort $(patsubst %/,%,$(dir $(wildcard examples/wasm-experts/*/*.c))))
# Succeeds when the C toolchain can compile and link a reactor.
C_TOOLCHAIN_PROBE = printf 'int x;\n' | $(WASM_CC) $(C_WASM_FLAGS) -x c -o /dev/null - >/dev/null 2>&1

.PHONY: help
help: ## Describe the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F ':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: build
build: examples ## Build the moehost binary into .tmp/bin
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost

# The build's -ldflags, for tests that build the binary as make build does.
.PHONY: print-ldflags
print-ldflags:
	@echo "$(GO_LDFLAGS)"

.PHONY: install
install: ## Install the moehost binary with go install (into $(GOBIN), or $(GOPATH)/bin)
	$(GO) install -ldflags '$(GO_LDFLAGS)' ./cmd/moehost
	@echo "installed $$(d=$$($(GO) env GOBIN); [ -n "$$d" ] || d=$$($(GO) env GOPATH)/bin; echo $$d)/moehost"

.PHONY: run
run: build ## Start `moehost serve` with its defaults (127.0.0.1:7700, ./moehost-data, ffn.[0:4])
	$(BIN)/moehost serve

# Always rebuilt (a second or two each): the build is reproducible, so a
# stale committed .wasm shows up in `git status` instead of in a test.
# The C examples are rebuilt only where their toolchain is installed, so
# that a machine with Go alone uses the committed .wasm.
.PHONY: examples
examples: ## Build the example experts (.wasm); the C ones only if clang for wasm32-wasi is installed
	@for d in $(EXAMPLES); do \
	  echo "building $$d"; \
	  (cd $$d && GOOS=wasip1 GOARCH=wasm $(GO) build $(WASM_FLAGS) -o $$(basename $$d).wasm .); \
	done
	@if $(C_TOOLCHAIN_PROBE); then \
	  $(MAKE) --no-print-directory examples-c; \
	else \
	  echo "note: no clang/wasm-ld/wasi-libc for wasm32-wasi: not rebuilding $(C_EXAMPLES) (the committed .wasm is used; make examples-c installs the toolchain)"; \
	fi

.PHONY: examples-c
examples-c: ## Build the C example experts (.wasm), installing Debian's clang, lld and wasi-libc first if missing
	@if ! $(C_TOOLCHAIN_PROBE); then ./scripts/install-c-wasm-toolchain.sh; fi
	@for d in $(C_EXAMPLES); do \
	  echo "building $$d"; \
	  $(WASM_CC) $(C_WASM_FLAGS) -o $$d/$$(basename $$d).wasm $$d/*.c; \
	done

.PHONY: checkexamples
checkexamples: examples ## Fail if a committed example .wasm differs from its source's build
	@git diff --exit-code --stat -- examples/ || { echo "examples/ is stale: run make examples and commit the .wasm"; exit 1; }

# make test: the checks, then two runs side by side (the end-to-end one
# mostly waits on child processes, so it overlaps the race run's CPU).
# Their output comes line by line as it is written, each line tagged with
# its run, so that every package's `ok` shows when it finishes rather than
# when the whole run does.
# Every server both runs start, in process or as a `moehost serve` child,
# shares one compilation cache, fresh each run and filled by `moehost
# compile` (without the detector: seconds, not minutes) before either
# starts, rather than compiling the examples once per server. The front
# door's tests that measure a compile upload new bytes, which no cache
# holds.
# The wasm vet uses -trimpath, as make examples does, so that it reuses the
# standard library the examples compiled for wasm.
TEST_COMPILE_CACHE := $(CURDIR)/.tmp/test-compile-cache
# Under make test, `$(call tagged,NAME)` after a command prefixes each line
# it prints with [NAME] (pipefail keeps its status); alone, it is nothing.
TEST_TAG ?=
tagged = $(if $(TEST_TAG),2>&1 | sed -u 's/^/[$(1)] /')

.PHONY: test
test: examples ## Check formatting, vet, build without cgo, and run every test: with the race detector, and tests/ and the CLI end to end without it (about 3 minutes on 2 idle cores with a warm build cache)
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -path './gen/*' -not -path './.tmp/*')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet -trimpath ./abi/... ./sdk/expert/... ./examples/wasm-experts/...
	CGO_ENABLED=0 $(GO) build ./...
	$(MAKE) --no-print-directory -j3 --output-sync=line TEST_TAG=1 test-race test-e2e test-compile

.PHONY: test-compile-cache
test-compile-cache: ## Empty .tmp/test-compile-cache and compile the examples into it with moehost compile, for the test runs' servers to share
	rm -rf $(TEST_COMPILE_CACHE)
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(BIN)/moehost compile --compile-cache $(TEST_COMPILE_CACHE)

.PHONY: test-race
test-race: test-compile-cache ## Every package's tests with the race detector (the ones in tests/ that run moehost serve in a child process, and the CLI's end-to-end ones skip themselves: make test-e2e runs them; the sandbox's compile tests too: make test-compile)
	MOEHOST_COMPILE_CACHE=$(TEST_COMPILE_CACHE) $(GO) test -race -timeout 12m ./... $(call tagged,race)

.PHONY: test-e2e
test-e2e: test-compile-cache ## tests/ and the CLI's tests without the race detector: moehost serve in child processes (one binary, built once), the CLI end to end, grpcurl, buf curl, the DHT swarm
	MOEHOST_COMPILE_CACHE=$(TEST_COMPILE_CACHE) $(GO) test -timeout 12m ./tests/ ./cmd/moehost/internal/cli/ $(call tagged,e2e)

.PHONY: test-compile
test-compile: ## The sandbox's compile tests without the race detector (they skip themselves under it): the Go ffn compiled in a compile child, the child refusing, the compile-cost bound
	$(GO) test -timeout 12m -run '^TestCompile' ./host/internal/sandbox/ $(call tagged,compile)

# Debian's Python (with Debian's python3-torch), not a virtualenv's.
PYTHON ?= /usr/bin/python3

# Not part of make test: minutes of one core in the emulator.
.PHONY: test-avx512-emu
test-avx512-emu: ## gpuhost's GEMM and row-kernel tests on the AVX-512 path in Bochs's emulated Skylake-X, for machines without AVX-512 (installs bochs, isolinux, xorriso if missing; Debian's kernel into .tmp/avx512-emu)
	GO=$(GO) ./scripts/avx512-emu.sh

.PHONY: test-python-interop
test-python-interop: ## Load an ffn checkpoint into PyTorch's FeedforwardBlock (strict=True) and compare outputs (needs python3-torch: scripts/install-python-torch.sh)
	MOEHOST_PYTHON=$(PYTHON) $(GO) test -count=1 -run '^TestPythonInterop$$' -v ./tests/

# build-ref builds git ref $(1)'s moehost into $(2), from an export of
# that ref, so that a benchmark measures before and after in one run.
define build-ref
src=$(CURDIR)/.tmp/ref-src; rm -rf $$src && mkdir -p $$src; \
	  git archive $(1) | tar -x -C $$src; \
	  echo "building $(1) into $(2)"; \
	  (cd $$src && $(GO) build -o $(2) ./cmd/moehost) || exit 1
endef

.PHONY: bench
bench: examples ## Serving load test (batching vs none, float32 vs float16 vs bfloat16 on the wire, 64 clients), 32 clients × 1 row against a `moehost serve` child (requests/s, server CPU-µs per request; BENCH_BEFORE=<git ref> also builds that ref and alternates 3 rounds of each), the Go benchmarks, density (1,024 ffn experts, shared vs one instance each) and the DHT (32 nodes: lookup p50/p99, announcing 1,000 experts)
	$(GO) run ./cmd/moehost bench --clients 64 --min-rows 1 --max-rows 16 --duration 10s --dtype float32,float16,bfloat16
	$(GO) build -o $(BIN)/moehost ./cmd/moehost
	@exes=$(BIN)/moehost; \
	if [ -n "$(BENCH_BEFORE)" ]; then \
	  $(call build-ref,$(BENCH_BEFORE),$(BIN)/moehost-before); \
	  exes=$(BIN)/moehost-before,$$exes; \
	fi; \
	set -x; $(BIN)/moehost bench --child --server-exe $$exes --clients 32 --min-rows 1 --max-rows 1 --duration 10s --data-dir $(CURDIR)/.tmp/bench-1row
	$(GO) test -run '^$$' -bench . -benchtime 5x ./gpuhost/ ./gpuhost/internal/cpu/ ./host/
	$(GO) test -run '^TestDensity$$' -v -timeout 30m ./host/ -args -density
	$(GO) test -run '^$$' -bench DHT -benchtime 3x ./host/internal/dht/

.PHONY: fuzz-sandbox
fuzz-sandbox: ## Fuzz the sandbox: op sequences against a budgeted instance, then the module decoder (FUZZTIME each, default 5m)
	$(GO) test -run '^$$' -fuzz '^FuzzOpSequence$$' -fuzztime $(or $(FUZZTIME),5m) ./host/internal/sandbox/
	$(GO) test -run '^$$' -fuzz '^FuzzInspect$$' -fuzztime $(or $(FUZZTIME),5m) ./host/internal/sandbox/

.PHONY: fuzz-tenant
fuzz-tenant: ## Fuzz the tenants file decoder and token sign-in (FUZZTIME each, default 1m)
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(or $(FUZZTIME),1m) ./host/tenant/
	$(GO) test -run '^$$' -fuzz '^FuzzAuthenticate$$' -fuzztime $(or $(FUZZTIME),1m) ./host/tenant/

.PHONY: measure-budget
measure-budget: ## The zoo's per-call host memory at its default configs, against the default BytesPerCall
	$(GO) test -run '^TestDefaultCallBudgetFitsZoo$$' -v ./host/internal/sandbox/ -args -zoobudget

.PHONY: test-fairness
test-fairness: ## Tenant A floods 8 experts with 32 clients while tenant B calls one at a time: B's p99 against 2 × (its unloaded p99 + A's mean batch), alone on the machine
	MOEHOST_FAIRNESS=1 $(GO) test -count=1 -run '^TestTenantsShareTheDeviceFairly$$' -v ./host/

.PHONY: bench-memory
bench-memory: ## RSS and throughput of `moehost serve` under 1–64-row requests, against the analytic floor, then its RSS after 30 s idle (about 3 minutes)
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(BIN)/moehost bench-memory --clients 16 --min-rows 1 --max-rows 64 --duration 60s --idle 30s --data-dir $(CURDIR)/.tmp/bench-memory

# A git ref that make bench-startup also builds (from a clean export of
# it) and measures beside this tree's binary, e.g. BENCH_STARTUP_BEFORE=main.
BENCH_STARTUP_BEFORE ?=
BENCH_STARTUP_RUNS ?= 10

.PHONY: bench-startup
bench-startup: ## `moehost serve` from exec to Ready (wall and CPU, p50 and min of BENCH_STARTUP_RUNS starts): a restart with a warm compile cache and checkpoints, and a fresh data dir; BENCH_STARTUP_BEFORE=<git ref> interleaves that ref's binary
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	@bins="--bin $(BIN)/moehost"; \
	if [ -n "$(BENCH_STARTUP_BEFORE)" ]; then \
	  $(call build-ref,$(BENCH_STARTUP_BEFORE),$(BIN)/moehost-before); \
	  bins="$$bins --bin $(BIN)/moehost-before"; \
	fi; \
	$(BIN)/moehost bench-startup --runs $(BENCH_STARTUP_RUNS) --data-dir $(CURDIR)/.tmp/bench-startup $$bins

.PHONY: bench-frontdoor
bench-frontdoor: ## What compiling a tenant's upload costs another tenant: alice's Forward p50/p99/worst during mallory's uploads of the 1.9 MB Go ffn, interleaved with quiet windows of the same length (a few minutes)
	$(GO) test -run '^$$' -bench ForwardDuringCompile -benchtime 6x ./tests/

# OpenBLAS picks its best kernel for the CPU at load time unless
# OPENBLAS_CORETYPE names one; some machines set it (and OPENBLAS_L2_SIZE)
# in the environment for older builds, which pins OpenBLAS to a slower
# kernel (Haswell's AVX2 on an AVX-512 Zen 5). The comparisons drop both so
# that OpenBLAS runs at its best, and print the kernel it chose; set
# OPENBLAS_BENCH_ENV= to keep the environment's.
OPENBLAS_BENCH_ENV ?= env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE

.PHONY: bench-kernels
bench-kernels: ## Our GEMM against OpenBLAS at 1 and 2 threads, one table (installs libopenblas-dev if missing)
	@dpkg -s libopenblas-dev >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y libopenblas-dev; }
	$(GO) test -c -tags openblas -o $(BIN)/cpu-openblas.test ./gpuhost/internal/cpu/
	$(OPENBLAS_BENCH_ENV) $(BIN)/cpu-openblas.test -test.run '^TestKernelTable$$' -kerneltable

# Debian's python3-torch: its interpreter, not a virtualenv's or pyenv's.
TORCH_PYTHON ?= /usr/bin/python3

.PHONY: bench-compare
bench-compare: ## hivemind's ffn on moehost (in-process and over RPC) against PyTorch eager, one table (installs python3-torch and OpenBLAS if missing)
	@# libopenblas0-pthread: without it Debian's torch runs on the reference BLAS (about 7 GFLOP/s).
	@dpkg -s python3-torch libopenblas0-pthread >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y python3-torch libopenblas0-pthread; }
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(OPENBLAS_BENCH_ENV) $(BIN)/moehost bench --compare --python $(TORCH_PYTHON) --torch-script scripts/bench_torch_ffn.py \
	  --hidden-dim 1024 --batch 256 --threads 2 --rounds 5 --seconds 3s --data-dir $(CURDIR)/.tmp/bench-compare

# Debian's interpreter, where python3-torch and python3-grpcio live.
PYTHON ?= /usr/bin/python3

.PHONY: python-stubs
python-stubs: ## Write sdk/python's protobuf and gRPC stubs (moehost/v1, committed) from host/internal/rpc/descriptors.binpb with internal/cmd/pystubs (Go alone; make generate runs it too)
	$(GO) run ./internal/cmd/pystubs

.PHONY: test-swarm-adversarial
test-swarm-adversarial: ## The swarm under longer attacks from outside peers against moehost serve: 1,000 strangers flooding the DHT store, 2 minutes of a sybil eclipse, 64 peers flooding a grid prefix
	MOEHOST_ADVERSARIAL=1 $(GO) test -count=1 -timeout 20m -run '^TestSwarm(StoreBounded|SybilEclipse|PrefixFlood)$$' -v ./tests/

.PHONY: test-python
test-python: ## Test sdk/python against a live `moehost serve`, and installed with pip into a fresh venv (installs Debian's python3-torch, -grpcio, -protobuf, -numpy, -venv, -setuptools, -wheel if missing)
	./scripts/install-python-deps.sh
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(GO) build -o $(BIN)/testca ./internal/cmd/testca
	MOEHOST_BIN=$(BIN)/moehost MOEHOST_TESTCA=$(BIN)/testca $(PYTHON) -m unittest discover -s sdk/python/tests -p 'test_*.py' -v

HIVEMIND1 := $(CURDIR)/.tmp/hivemind1

.PHONY: hivemind1
hivemind1: ## Build hivemind 1.1.11 and its p2pd into .tmp/hivemind1 from the shared hivemind1 folder (cached; about 100 s the first time)
	./scripts/build-hivemind.sh $(HIVEMIND1)

.PHONY: test-hivemind
test-hivemind: hivemind1 ## The unmodified hivemind 1.1.11 client against `moehost serve --hivemind`: DHT lookup, Forward/Backward against PyTorch, a 2x2 mixture training beside hivemind's own server, a mixed swarm, streaming and bad input; det_dropout (int64 mask), transformer (bool mask) and nop_delay with hivemind's schemas
	$(GO) build -o $(BIN)/moehost ./cmd/moehost
	MOEHOST_BIN=$(BIN)/moehost $(HIVEMIND1)/bin/python tests/hivemind_e2e.py -v

# Extra flags for scripts/bench_hivemind.py, e.g. --loads 8x256x8 or --no-own.
BENCH_HIVEMIND_ARGS ?=

.PHONY: bench-hivemind
bench-hivemind: hivemind1 ## hivemind 1.1.11's benchmark_throughput client against `moehost serve --hivemind` and hivemind's own server, one run: 4 ffn experts, 8x256 and 32x1, forward and forward+backward, one table (a few minutes)
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(HIVEMIND1)/bin/python scripts/bench_hivemind.py --moehost $(BIN)/moehost --benchmarks $(HIVEMIND1)/share/hivemind-1.1.11/benchmarks $(BENCH_HIVEMIND_ARGS)

.PHONY: lint
lint: ## gofmt, then go vet and staticcheck for the default and cudaemu tags (cudaemu only where g++ is installed)
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); exit 1; }
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(GO) vet ./...
	$(BIN)/staticcheck ./...
	@if command -v g++ >/dev/null; then \
	  echo "$(GO) vet -tags cudaemu ./... && staticcheck -tags cudaemu ./..."; \
	  $(GO) vet -tags cudaemu ./... && $(BIN)/staticcheck -tags cudaemu ./...; \
	else echo "lint: cudaemu tag skipped (no g++)"; fi

.PHONY: generate
generate: ## Regenerate gen/ and host/internal/rpc/descriptors.binpb from proto/ with buf, and sdk/python's stubs from the descriptors
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
	PATH="$(BIN):$$PATH" $(BIN)/buf lint
	PATH="$(BIN):$$PATH" $(BIN)/buf generate
	# The descriptors that server reflection serves, with source info, so
	# that grpcurl describe shows the comments (host/internal/rpc embeds them).
	$(BIN)/buf build -o host/internal/rpc/descriptors.binpb
	$(GO) run ./internal/cmd/pystubs

.PHONY: checkgenerate
checkgenerate: generate ## Fail if generated code is stale
	@stale=$$(git status --porcelain -- gen/ host/internal/rpc/descriptors.binpb sdk/python/moehost/v1/); \
	  if [ -n "$$stale" ]; then git diff --stat -- gen/ host/internal/rpc/descriptors.binpb sdk/python/moehost/v1/; echo "$$stale"; \
	  echo "gen/, host/internal/rpc/descriptors.binpb or sdk/python/moehost/v1/ is stale: run make generate and commit them"; exit 1; fi

.PHONY: check
check: lint test checkgenerate ## Everything CI could ask for
	CGO_ENABLED=0 $(GO) build ./...
	GOARCH=arm64 $(GO) vet ./gpuhost/...
	$(GO) vet -tags purego ./gpuhost/...
	@cd gpuhost/internal/cpu && $(GO) run ../asmgen/main.go | diff -q - gemm_amd64.s >/dev/null || { echo "gpuhost/internal/cpu/gemm_amd64.s is stale: go generate ./gpuhost/internal/cpu/"; exit 1; }
	@if command -v $(NVCC) >/dev/null; then $(MAKE) --no-print-directory check-cuda; else echo "check-cuda: skipped (no CUDA toolkit; make check-cuda installs it)"; fi

# The web parts: the TypeScript client (sdk/ts), the dashboard
# (host/internal/ui/web, built into host/internal/ui/dist and embedded) and the browser tests
# (tests/web). Node.js 20+ and npm; package-lock.json pins every package.
NPM ?= npm
NPM_CI := $(NPM) ci --no-audit --no-fund --loglevel=error
TS_DIR := sdk/ts
UI_DIR := host/internal/ui/web
WEB_TEST_DIR := tests/web
# Debian's Chromium, driven by playwright-core: never a downloaded browser.
CHROMIUM ?= /usr/bin/chromium

.PHONY: generate-ts
generate-ts: ## Regenerate the TypeScript client's code (sdk/ts/src/gen) from proto/ with buf and protoc-gen-es
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	cd $(TS_DIR) && $(NPM_CI) && $(BIN)/buf generate --template buf.gen.yaml

.PHONY: ui
ui: ## Build the dashboard (host/internal/ui/web) with Vite into host/internal/ui/dist, which the binary embeds
	@# The dashboard compiles sdk/ts's sources, which import sdk/ts's packages.
	cd $(TS_DIR) && $(NPM_CI)
	cd $(UI_DIR) && $(NPM_CI) && $(NPM) run build

.PHONY: checkui
checkui: ui ## Fail if the committed dashboard build (host/internal/ui/dist) differs from its source's build
	@stale=$$(git status --porcelain -- host/internal/ui/dist); \
	  if [ -n "$$stale" ]; then echo "$$stale"; echo "host/internal/ui/dist is stale: run make ui and commit it"; exit 1; fi

.PHONY: test-ts
test-ts: ## Test the TypeScript client in Node against a live moehost serve
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(GO) build -o $(BIN)/testca ./internal/cmd/testca
	cd $(TS_DIR) && $(NPM_CI) && MOEHOST_BIN=$(BIN)/moehost MOEHOST_TESTCA=$(BIN)/testca $(NPM) test

.PHONY: test-web
test-web: ## Browser tests of the dashboard and of CORS in headless Chromium (installs Debian's chromium if missing)
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; }
	$(GO) build -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost ./cmd/moehost
	$(GO) build -o $(BIN)/testca ./internal/cmd/testca
	@# The browser tests compile sdk/ts's sources too: install its packages,
	@# so that this target works alone on a fresh clone.
	cd $(TS_DIR) && $(NPM_CI)
	cd $(WEB_TEST_DIR) && $(NPM_CI) && MOEHOST_BIN=$(BIN)/moehost MOEHOST_TESTCA=$(BIN)/testca CHROMIUM=$(CHROMIUM) \
	  WEB_TEST_OUT=$(CURDIR)/.tmp/test-web $(NPM) test

# The CUDA device (gpuhost/internal/cuda): Debian's CUDA 11.8 toolkit
# (scripts/install-cuda-toolkit.sh) compiles the kernels to PTX for
# compute_80, which the GPU's driver JIT-compiles for Ampere, Hopper and
# later. nvcc 11.8 needs clang-14 as its host compiler.
CUDA_KERNELS := gpuhost/internal/cuda/kernels
NVCC ?= nvcc
NVCC_FLAGS := -ccbin clang-14 -ptx -arch=compute_80 -I$(CUDA_KERNELS)

.PHONY: generate-cuda
generate-cuda: ## Regenerate the CUDA kernels' PTX (gpuhost/internal/cuda/kernels/moehost.ptx) with nvcc (installs the toolkit if missing)
	./scripts/install-cuda-toolkit.sh
	$(NVCC) $(NVCC_FLAGS) -o $(CUDA_KERNELS)/moehost.ptx $(CUDA_KERNELS)/moehost.cu

.PHONY: check-cuda
check-cuda: ## Compile-check and vet the cuda tag (installs the toolkit if missing), vet the cudaemu tag, and fail if the committed PTX is stale
	./scripts/install-cuda-toolkit.sh
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  $(NVCC) $(NVCC_FLAGS) -o "$$tmp/moehost.ptx" $(CUDA_KERNELS)/moehost.cu; \
	  cmp -s "$$tmp/moehost.ptx" $(CUDA_KERNELS)/moehost.ptx || { echo "$(CUDA_KERNELS)/moehost.ptx is stale: run make generate-cuda and commit it"; exit 1; }
	$(GO) build -tags cuda ./...
	$(GO) vet -tags cuda ./...
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  echo "$(GO) test -c -tags cuda ./gpuhost/... ./host/"; \
	  $(GO) test -c -tags cuda -o "$$tmp/" ./gpuhost/... ./host/
	$(GO) vet -tags cudaemu ./...

.PHONY: build-cuda
build-cuda: examples ## Build the moehost binary with the CUDA device (tag cuda) into .tmp/bin/moehost-cuda (installs the toolkit if missing)
	./scripts/install-cuda-toolkit.sh
	$(GO) build -tags cuda -ldflags '$(GO_LDFLAGS)' -o $(BIN)/moehost-cuda ./cmd/moehost

# host's tests of --device cuda; the rest of host runs in make test.
CUDAEMU_HOST_TESTS := ^(TestServeOnEmulatedCUDA|TestExpertsRoundRobinOnTwoGPUs|TestParseDeviceSpec)$$

.PHONY: test-cudaemu
test-cudaemu: ## The CUDA device on the CPU emulator (tag cudaemu; needs cgo and g++, no GPU): gpuhost's device table and driver tests, and host's --device cuda wiring, with -race
	$(GO) test -race -tags cudaemu ./gpuhost/...
	$(GO) test -race -tags cudaemu -run '$(CUDAEMU_HOST_TESTS)' ./host/

.PHONY: device-check
device-check: ## Build the GPU device check's binaries into .tmp/device-check (scripts/device-check.sh); scripts/device-run.sh runs them on the GPU machine
	./scripts/device-check.sh

.PHONY: clean
clean: ## Remove build outputs and the default data dir
	rm -rf .tmp moehost-data
