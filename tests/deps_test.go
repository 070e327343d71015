package tests

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/moehost/moehost/"

// TestDependenciesPointOneWay enforces the package map of DESIGN.md: each
// room imports only what it may, so that the rooms stay replaceable.
func TestDependenciesPointOneWay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pkg     string
		allowed []string // prefixes of our packages it may depend on
	}{
		{"abi", nil},
		{"gpuhost", []string{"abi", "gpuhost/internal/"}},
		{"gpuhost/internal/cpu", nil},
		{"sdk/expert", []string{"abi"}},
		{"modules", []string{"abi", "internal/atomicfile"}},
		{"sdk/swarm", []string{"gen/"}},
		{"sdk/wire", []string{"abi", "gen/"}},
		{"sdk/client", []string{"abi", "gen/", "sdk/swarm", "sdk/wire"}},
		{"host/internal/batch", nil},
		{"host/internal/sched", nil},
		{"host/internal/sandbox", []string{"abi", "gpuhost", "modules"}},
		// The expert lifecycle builds on the sandbox, the pools and the
		// workers, and on no room of the wire (rpc, dht, hivemind, ui).
		{"host/internal/experts", []string{"abi", "gpuhost", "gen/", "host/checkpoint", "host/internal/batch", "host/internal/sandbox", "host/internal/sched", "modules", "sdk/swarm", "sdk/wire"}},
		{"host/internal/rpc", []string{"abi", "gen/", "sdk/swarm", "sdk/wire"}},
		{"host/checkpoint", []string{"internal/atomicfile"}},
		{"host/internal/dht", []string{"gen/", "internal/atomicfile", "sdk/swarm"}},
		{"host/internal/blob", []string{"host/checkpoint", "internal/atomicfile"}},
		{"host/internal/hivemind", []string{"abi", "gen/", "internal/atomicfile"}},
		{"host/internal/ui", nil},
		{"host/internal/certs", nil},
		{"host/tenant", []string{"abi", "internal/atomicfile", "modules"}},
		{"host", []string{"abi", "gpuhost", "gen/", "host/", "internal/", "modules", "sdk/swarm", "sdk/wire"}},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			t.Parallel()
			out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+tt.pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			for _, dep := range strings.Fields(string(out)) {
				ours, ok := strings.CutPrefix(dep, mod)
				if !ok || ours == tt.pkg {
					continue
				}
				// The root's internal/ packages are leaf utilities
				// (atomic writes, benchmark switches) any room may use.
				allowed := strings.HasPrefix(ours, "internal/")
				for _, a := range tt.allowed {
					allowed = allowed || ours == a || strings.HasPrefix(ours, a+"/") || (strings.HasSuffix(a, "/") && strings.HasPrefix(ours, a))
				}
				if !allowed {
					t.Errorf("%s depends on %s; it may depend only on %v", tt.pkg, ours, tt.allowed)
				}
			}
		})
	}
}

// TestGuestPackagesBuildForWasm checks that the contract and the guest SDK
// build for the guest's platform.
func TestGuestPackagesBuildForWasm(t *testing.T) {
	t.Parallel()
	// -trimpath, as make examples builds: the standard library compiled
	// for wasm is then shared with it.
	cmd := exec.Command("go", "build", "-trimpath", "./abi/", "./sdk/expert/", "./examples/wasm-experts/...")
	cmd.Dir = ".."
	cmd.Env = append(cmd.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=wasip1 go build: %v\n%s", err, out)
	}
}
