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
# apt-get needs root; others go through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Guest experts: reproducible builds, so the committed .wasm files match.
WASM_FLAGS := -trimpath -ldflags='-s -w -buildid=' -buildmode=c-shared
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
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F ':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: build
build: examples ## Build the moehost binary into .tmp/bin
	$(GO) build -o $(BIN)/moehost ./cmd/moehost

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

.PHONY: test
test: examples ## Check formatting, vet, build without cgo, and run every test with the race detector
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -path './gen/*' -not -path './.tmp/*')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./abi/... ./sdk/expert/... ./examples/wasm-experts/...
	CGO_ENABLED=0 $(GO) build ./...
	$(GO) test -race -timeout 12m ./...

.PHONY: bench
bench: examples ## Serving load test (batching vs none, 64 clients), the Go benchmarks and the DHT (32 nodes: lookup p50/p99, announcing 1,000 experts)
	$(GO) run ./cmd/moehost bench --clients 64 --min-rows 1 --max-rows 16 --duration 10s
	$(GO) test -run '^$$' -bench . -benchtime 5x ./gpuhost/ ./host/
	$(GO) test -run '^$$' -bench DHT -benchtime 3x ./host/dht/

.PHONY: fuzz-sandbox
fuzz-sandbox: ## Fuzz the sandbox: op sequences against a budgeted instance, then the module decoder (FUZZTIME each, default 5m)
	$(GO) test -run '^$$' -fuzz '^FuzzOpSequence$$' -fuzztime $(or $(FUZZTIME),5m) ./host/sandbox/
	$(GO) test -run '^$$' -fuzz '^FuzzInspect$$' -fuzztime $(or $(FUZZTIME),5m) ./host/sandbox/

.PHONY: measure-budget
measure-budget: ## The zoo's per-call host memory at its default configs, against the default BytesPerCall
	$(GO) test -run '^TestDefaultCallBudgetFitsZoo$$' -v ./host/sandbox/ -args -zoobudget

.PHONY: bench-kernels
bench-kernels: ## Our GEMM against OpenBLAS at 1 and 2 threads, one table (installs libopenblas-dev if missing)
	@dpkg -s libopenblas-dev >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y libopenblas-dev; }
	$(GO) test -c -tags openblas -o $(BIN)/gpuhost-openblas.test ./gpuhost/
	$(BIN)/gpuhost-openblas.test -test.run '^TestKernelTable$$' -kerneltable

# Debian's python3-torch: its interpreter, not a virtualenv's or pyenv's.
TORCH_PYTHON ?= /usr/bin/python3

.PHONY: bench-compare
bench-compare: ## hivemind's ffn on moehost (in-process and over RPC) against PyTorch eager, one table (installs python3-torch if missing)
	@dpkg -s python3-torch >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y python3-torch; }
	$(GO) build -o $(BIN)/moehost ./cmd/moehost
	$(BIN)/moehost bench --compare --python $(TORCH_PYTHON) --torch-script scripts/bench_torch_ffn.py \
	  --hidden-dim 1024 --batch 256 --threads 2 --rounds 5 --seconds 3s --data-dir $(CURDIR)/.tmp/bench-compare

.PHONY: lint
lint: ## go vet, gofmt and staticcheck
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); exit 1; }
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(BIN)/staticcheck ./...

.PHONY: generate
generate: ## Regenerate gen/ from proto/ with buf
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
	PATH="$(BIN):$$PATH" $(BIN)/buf lint
	PATH="$(BIN):$$PATH" $(BIN)/buf generate

.PHONY: checkgenerate
checkgenerate: generate ## Fail if generated code is stale
	@git diff --exit-code -- gen/ || { echo "gen/ is stale: run make generate"; exit 1; }

.PHONY: check
check: lint test checkgenerate ## Everything CI could ask for
	CGO_ENABLED=0 $(GO) build ./...
	GOARCH=arm64 $(GO) vet ./gpuhost/...
	$(GO) vet -tags purego ./gpuhost/...
	@cd gpuhost && $(GO) run internal/asmgen/main.go | diff -q - gemm_amd64.s >/dev/null || { echo "gpuhost/gemm_amd64.s is stale: cd gpuhost && go run internal/asmgen/main.go > gemm_amd64.s"; exit 1; }

.PHONY: clean
clean: ## Remove build outputs and the default data dir
	rm -rf .tmp moehost-data
