package cli

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/moehost/moehost/cmd/moehost/internal/loadgen"
	"github.com/moehost/moehost/host"
)

// TestServeErrors runs `moehost serve` with what newcomers get wrong, and
// checks that each error names the problem.
func TestServeErrors(t *testing.T) {
	skipUnderRace(t)
	dir := t.TempDir()
	notWasm := filepath.Join(dir, "model.wasm")
	if err := os.WriteFile(notWasm, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"serve", "--listen", "127.0.0.1:*", "--data-dir", filepath.Join(dir, "data"), "--experts", "x.0"}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tests := []struct {
		name string
		args []string
		want []string // substrings of the error
	}{
		{"port in use suggests a free one", []string{"--module", "nop", "--no-dht", "--listen", taken.Addr().String()}, []string{"address already in use", "--listen 127.0.0.1:*"}},
		{"host's own errors", []string{"--update-period", "0s"}, []string{"update period 0s is not positive"}},
		{"not wasm names the file", []string{"--module", notWasm}, []string{notWasm, "not a WebAssembly module"}},
		{"typo lists the built-ins", []string{"--module", "ffnn"}, []string{`"ffnn"`, "ffn, ffn-c, nop, nop_delay, det_dropout, transformer, ste_relu"}},
		{"hidden dim 0 blames dim 1", []string{"--module", "ste_relu", "--hidden-dim", "0"}, []string{"dim 1 of shape [-1 0] is 0"}},
		// A bad config value is the caller's: the message says so, and
		// names the value and the module's reason.
		{"hidden dim 0 is the config's fault", []string{"--hidden-dim", "0", "--no-dht"}, []string{"config hidden_dim=0 refused by the module's moe_init", "hidden_dim must be positive"}},
		// --update-period 0s fails the server at once should the flags pass.
		{"no-dht with initial-peers", []string{"--update-period", "0s", "--no-dht", "--initial-peers", "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"}, []string{"--no-dht", "--initial-peers"}},
		{"unknown flag suggests the nearest", []string{"--hiden-dim", "8"}, []string{"unknown flag: --hiden-dim", "did you mean --hidden-dim?"}},
		{"log format", []string{"--log-format", "xml"}, []string{`--log-format "xml": want text or json`}},
		{"log level", []string{"--log-level", "loud"}, []string{`--log-level "loud"`}},
		{"max request bytes", []string{"--max-request-bytes", "0"}, []string{"--max-request-bytes 0"}},
		// ste_relu passes the default module limits (and fails later, at
		// moe_init, on its hidden_dim) but not a lowered one.
		{"default module limits accept", []string{"--module", "ste_relu", "--hidden-dim", "0", "--no-dht"}, []string{"dim 1 of shape [-1 0] is 0"}},
		{"a lowered module limit refuses", []string{"--module", "ste_relu", "--hidden-dim", "0", "--no-dht", "--module-function-body-bytes", "16"}, []string{"bytes of one function body", "the limit is 16"}},
		// --update-period 0s fails the server at once should the limit
		// pass.
		{"module limit 0", []string{"--module-locals", "0", "--update-period", "0s"}, []string{"--module-locals 0: must be positive"}},
		{"tls cert without key", []string{"--tls-cert", notWasm, "--update-period", "0s"}, []string{"--tls-cert", "--tls-key"}},
		{"tls client CA without cert", []string{"--tls-client-ca", notWasm, "--update-period", "0s"}, []string{"--tls-cert", "--tls-key"}},
		{"tls cert that is no certificate", []string{"--module", "nop", "--no-dht", "--tls-cert", notWasm, "--tls-key", notWasm}, []string{"TLS certificate " + notWasm}},
		{"module limit negative", []string{"--module-compile-timeout", "-1s", "--update-period", "0s"}, []string{"--module-compile-timeout -1s: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Main(append(base, tt.args...), &stdout, &stderr); code != 1 {
				t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Contains(tt.name, "config's fault") && strings.Contains(msg, "invalid expert module") {
				t.Errorf("error %q blames the module", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			if n := strings.Count(msg, "moehost:"); n != 1 {
				t.Errorf("error %q has %d \"moehost:\" prefixes, want 1", msg, n)
			}
			// Each code at most once: no "invalid argument: invalid argument".
			if strings.Count(msg, "invalid argument") > 1 {
				t.Errorf("error %q repeats its code", msg)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit code %d: %s", args, code, stderr.String())
		}
		if got := stdout.String(); !strings.HasPrefix(got, "moehost ") || !strings.Contains(got, "go1.") {
			t.Errorf("%v printed %q, want moehost's version and Go's", args, got)
		}
	}
}

// TestBenchModule benchmarks a module named with --module, on every wire
// dtype, briefly.
func TestBenchModule(t *testing.T) {
	skipUnderRace(t)
	var stdout, stderr bytes.Buffer
	args := []string{"bench", "--module", "nop", "--hidden-dim", "4", "--experts", "nop.[0:2]", "--clients", "2",
		"--duration", "200ms", "--dtype", "float32,bfloat16", "--data-dir", t.TempDir()}
	if code := Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	for _, want := range []string{"module nop", "batching float32", "batching bfloat16", "bfloat16: 0.5"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("bench output does not contain %q:\n%s", want, stdout.String())
		}
	}
	stderr.Reset()
	if code := Main([]string{"bench", "--module", "ffnn"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "ste_relu") {
		t.Errorf("bench --module ffnn: exit %d, %q; want the built-ins listed", code, stderr.String())
	}
	stderr.Reset()
	if code := Main([]string{"bench", "--dtype", "int8"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `--dtype "int8"`) {
		t.Errorf("bench --dtype int8: exit %d, %q", code, stderr.String())
	}
}

// TestBenchChildBuilds serves the 1-row line from two builds in
// alternating rounds (both this test binary, as moehost) and checks that
// each build's rounds and medians are printed, against the first.
func TestBenchChildBuilds(t *testing.T) {
	skipUnderRace(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := filepath.Join(t.TempDir(), "moehost-before")
	if err := os.Symlink(self, before); err != nil {
		t.Fatal(err)
	}
	t.Setenv(asMoehostEnv, "1")
	var stdout, stderr bytes.Buffer
	args := []string{"bench", "--child", "--server-exe", before + "," + self, "--rounds", "2",
		"--module", "nop", "--hidden-dim", "4", "--experts", "nop.[0:2]", "--clients", "2",
		"--min-rows", "1", "--max-rows", "1", "--duration", "200ms", "--data-dir", t.TempDir()}
	if code := Main(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	out := stdout.String()
	b, s := "moehost-before", filepath.Base(self)
	for _, want := range []string{
		"batching float32, " + b + ", round 1", "batching float32, " + s + ", round 1",
		"batching float32, " + s + ", round 2", "batching float32, " + b + ", round 2",
		"medians of 2 rounds", "batching float32, " + b + ": ",
		"the CPU per request of " + b + ")",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output does not contain %q:\n%s", want, out)
		}
	}
	// Round 2 starts with the other build.
	if i, j := strings.Index(out, s+", round 2"), strings.Index(out, b+", round 2"); i < 0 || j < 0 || i > j {
		t.Errorf("round 2 did not start with %s:\n%s", s, out)
	}
}

// TestChildMedians checks the medians and ratios of the builds' rounds.
func TestChildMedians(t *testing.T) {
	res := func(requests int, cpuPerReq time.Duration) loadgen.Result {
		return loadgen.Result{Requests: requests, Elapsed: time.Second, ServerCPU: cpuPerReq * time.Duration(requests)}
	}
	got := childMedians("m", []string{"/x/old", ""}, [][]loadgen.Result{
		{res(100, 900*time.Microsecond), res(300, 700*time.Microsecond), res(200, 800*time.Microsecond)},
		{res(500, 400*time.Microsecond), res(400, 300*time.Microsecond), res(100, 500*time.Microsecond)},
	})
	want := "m, old: 200 requests/s, 800 server CPU-µs per request\n" +
		"m, this build: 400 requests/s, 400 server CPU-µs per request (2.00× the requests/s and 0.50× the CPU per request of old)"
	if got != want {
		t.Errorf("childMedians:\n%s\nwant\n%s", got, want)
	}
	// Builds of one name are labelled by their paths.
	got = childMedians("m", []string{"a/moehost", "b/moehost", "c/other"}, [][]loadgen.Result{
		{res(100, time.Millisecond)}, {res(100, time.Millisecond)}, {res(100, time.Millisecond)},
	})
	for _, label := range []string{"m, a/moehost:", "m, b/moehost:", "m, other:", "of a/moehost)"} {
		if !strings.Contains(got, label) {
			t.Errorf("childMedians of builds a/moehost, b/moehost, c/other: no %q in\n%s", label, got)
		}
	}
}

// TestModuleSourceDigest: --module sha256:<hex> names a stored module by
// digest, and a malformed digest is refused before the server starts.
func TestModuleSourceDigest(t *testing.T) {
	t.Parallel()
	d := "sha256:" + strings.Repeat("ab", 32)
	src, err := moduleSource(d)
	if err != nil || !reflect.DeepEqual(src, host.ModuleDigest(d)) {
		t.Errorf("moduleSource(%s) = %+v, %v; want host.ModuleDigest", d, src, err)
	}
	if _, err := moduleSource("sha256:zz"); err == nil {
		t.Error("a malformed digest was accepted")
	}
}
