package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moehost/moehost/host/tenant"
)

// runT is run (modules_test.go) with the exit code first.
func runT(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	stdout, stderr, code := run(args...)
	return code, stdout, stderr
}

var tokenRE = regexp.MustCompile(`^moe_[A-Za-z0-9_-]{43}$`)

// lastLine returns the last line of out, which must end in a newline.
func lastLine(t *testing.T, out string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestTenantRoundTrip: add prints a token that a Set accepts, list shows
// the tenant without secrets, rotate and remove revoke what they should.
func TestTenantRoundTrip(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	path := filepath.Join(dataDir, tenant.FileName)

	code, out, errOut := runT(t, "tenant", "add", "alice", "--prefix", "alice", "--prefix", "shared.alice",
		"--cap-modules", "4", "--cap-module-bytes", "64MiB", "--cap-call-timeout", "30s", "--cap-queue-share", "3", "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("tenant add: exit %d: %s", code, errOut)
	}
	alice := lastLine(t, out)
	if !tokenRE.MatchString(alice) {
		t.Fatalf("tenant add's last line of stdout %q is not a token", alice)
	}
	if !strings.Contains(errOut, "shown only this once") {
		t.Errorf("tenant add's stderr %q does not say the token is shown once", errOut)
	}
	code, out, errOut = runT(t, "tenant", "add", "bob", "--prefix", "bob", "--tenants", path)
	if code != 0 {
		t.Fatalf("tenant add bob: exit %d: %s", code, errOut)
	}
	bob := lastLine(t, out)

	set, err := tenant.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]string{alice: "alice", bob: "bob"} {
		if name, ok := set.Authenticate(tok); !ok || name != want {
			t.Errorf("the printed token of %s authenticates as %q, %v", want, name, ok)
		}
	}
	if a, _ := set.Tenant("alice"); a.Caps != (tenant.Caps{Modules: 4, ModuleBytes: 64 << 20, CallTimeout: 30e9, QueueShare: 3}) {
		t.Errorf("alice's caps %+v", a.Caps)
	}

	code, out, errOut = runT(t, "tenant", "list", "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("tenant list: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"alice", "alice,shared.alice", "modules=4 module_bytes=67108864 call_timeout=30s queue_share=3", "bob", "defaults"} {
		if !strings.Contains(out, want) {
			t.Errorf("tenant list does not show %q:\n%s", want, out)
		}
	}
	raw, _ := os.ReadFile(path)
	for _, secret := range append(regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindAllString(string(raw), -1), alice, bob, "sha256:") {
		if strings.Contains(out, secret) {
			t.Errorf("tenant list shows %q", secret)
		}
	}

	if code, _, errOut = runT(t, "tenant", "caps", "bob", "--cap-experts", "7", "--tenants", path); code != 0 {
		t.Fatalf("tenant caps: exit %d: %s", code, errOut)
	}
	if code, _, errOut = runT(t, "tenant", "caps", "alice", "--cap-modules", "0", "--tenants", path); code != 0 {
		t.Fatalf("tenant caps: exit %d: %s", code, errOut)
	}
	if err := set.Reload(); err != nil {
		t.Fatal(err)
	}
	if b, _ := set.Tenant("bob"); b.Caps != (tenant.Caps{Experts: 7}) {
		t.Errorf("bob's caps after tenant caps: %+v", b.Caps)
	}
	if a, _ := set.Tenant("alice"); a.Caps != (tenant.Caps{ModuleBytes: 64 << 20, CallTimeout: 30e9, QueueShare: 3}) {
		t.Errorf("alice's caps after tenant caps --cap-modules 0: %+v (only modules should change)", a.Caps)
	}

	code, out, errOut = runT(t, "tenant", "rotate", "bob", "--tenants", path)
	if code != 0 {
		t.Fatalf("tenant rotate: exit %d: %s", code, errOut)
	}
	bob2 := lastLine(t, out)
	if !tokenRE.MatchString(bob2) || bob2 == bob {
		t.Fatalf("tenant rotate printed %q", bob2)
	}
	if code, _, errOut = runT(t, "tenant", "remove", "alice", "--data-dir", dataDir); code != 0 {
		t.Fatalf("tenant remove: exit %d: %s", code, errOut)
	}
	if _, ok := set.Authenticate(alice); !ok {
		t.Error("alice's token stopped working before the server reloaded")
	}
	if err := set.Reload(); err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]string{alice: "", bob: "", bob2: "bob"} {
		if name, _ := set.Authenticate(tok); name != want {
			t.Errorf("after remove and rotate, a token authenticates as %q, want %q", name, want)
		}
	}
}

// TestTenantErrors: each mistake exits 1 with a message naming it, and
// leaves the file as it was.
func TestTenantErrors(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tenants.json")
	if code, _, errOut := runT(t, "tenant", "add", "alice", "--prefix", "alice", "--tenants", path); code != 0 {
		t.Fatalf("tenant add: %s", errOut)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no prefix", []string{"add", "bob"}, "--prefix: give at least one"},
		{"taken name", []string{"add", "alice", "--prefix", "x"}, `tenant "alice" already exists`},
		{"overlapping prefix", []string{"add", "bob", "--prefix", "alice.bob"}, `prefix "alice.bob" overlaps prefix "alice" of tenant "alice"`},
		{"bad prefix", []string{"add", "bob", "--prefix", "bob.[0:4]"}, `prefixes[0]: prefix "bob.[0:4]" contains '['`},
		{"bad name", []string{"add", "Bob", "--prefix", "bob"}, `name "Bob"`},
		{"negative cap", []string{"add", "bob", "--prefix", "bob", "--cap-experts", "-1"}, "caps.experts -1: must not be negative"},
		{"bad bytes", []string{"add", "bob", "--prefix", "bob", "--cap-param-bytes", "lots"}, `"lots" is not a byte count`},
		{"too many pages", []string{"caps", "alice", "--cap-memory-pages", "70000"}, "caps.memory_pages 70000"},
		{"remove unknown", []string{"remove", "carol"}, `tenant "carol": no such tenant`},
		{"rotate unknown", []string{"rotate", "carol"}, `tenant "carol": no such tenant`},
		{"caps unknown", []string{"caps", "carol", "--cap-experts", "1"}, `tenant "carol": no such tenant`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runT(t, append(append([]string{"tenant"}, tt.args...), "--tenants", path)...)
			if code != 1 || !strings.Contains(errOut, tt.want) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", code, errOut, tt.want)
			}
			if tokenRE.MatchString(strings.TrimSpace(out)) {
				t.Errorf("a failed command printed a token")
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
				t.Errorf("a failed command changed the file")
			}
		})
	}
	if code, _, errOut := runT(t, "tenant", "list", "--tenants", filepath.Join(t.TempDir(), "none.json")); code != 0 {
		t.Errorf("tenant list of a missing file: exit %d: %s", code, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"version":1,"tenants":[{"name":"x","prefixes":["x"],"token_hashes":[]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runT(t, "tenant", "list", "--tenants", bad); code != 1 || !strings.Contains(errOut, `tenant "x": token_hashes: none`) {
		t.Errorf("tenant list of a bad file: exit %d, %q", code, errOut)
	}
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1048576", 1 << 20, true}, {"64MiB", 64 << 20, true}, {"2GiB", 2 << 30, true},
		{"1KB", 1000, true}, {"3 MB", 3e6, true}, {"10B", 10, true}, {"1TiB", 1 << 40, true},
		{"-1", 0, false}, {"1.5GiB", 0, false}, {"GiB", 0, false}, {"9000000TiB", 0, false}, {"12QB", 0, false},
	} {
		var b byteSize
		err := b.Set(tt.in)
		if (err == nil) != tt.ok || tt.ok && int64(b) != tt.want {
			t.Errorf("Set(%q) = %d, %v; want %d, ok %v", tt.in, b, err, tt.want, tt.ok)
		}
	}
}
