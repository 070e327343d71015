package tests

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readmeBlocks returns the fenced code blocks of README.md between the
// headings from and to (to "" for the file's end).
func readmeBlocks(t *testing.T, from, to string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, from)
	if i < 0 {
		t.Fatalf("README has no %q", from)
	}
	s = s[i:]
	if to != "" {
		if j := strings.Index(s, to); j > 0 {
			s = s[:j]
		}
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```[a-z]*\n(.*?)```").FindAllStringSubmatch(s, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// TestReadmeWalkthrough runs the README's quick start (grpcurl, buf curl,
// curl against moehost serve) and its first-expert walkthrough (expert
// new and build, a tenant, serve --tenants, upload, deploy, a Forward with
// curl) as written, with the binary on PATH as make build leaves it. The
// only changes: the fixed 127.0.0.1:7700 becomes a free port (serve gets
// --listen for it), make run becomes moehost serve, and a line that starts
// a server in the background waits until it answers. So the README cannot
// drift from what works.
func TestReadmeWalkthrough(t *testing.T) {
	t.Parallel()
	bin := buildMoehost(t, "")
	// Where make build leaves it, so that expert new finds the checkout.
	binDir, err := filepath.Abs(filepath.Join("..", ".tmp", "readme-test-bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, bin, filepath.Join(binDir, "moehost"))

	quick := readmeBlocks(t, "`make run` hosts", "## `moehost serve` flags")
	if len(quick) != 2 {
		t.Fatalf("the quick start has %d code blocks, want the installs and the tries", len(quick))
	}
	// The README's install lines name the versions the tests pin.
	for _, want := range []string{"grpcurl/cmd/grpcurl@" + grpcurlVersion + "\n", "buf/cmd/buf@" + bufVersion(t) + "\n"} {
		if !strings.Contains(quick[0], want) {
			t.Errorf("the README's installs %q do not pin %q", quick[0], want)
		}
	}
	first := readmeBlocks(t, "### Your first expert", "\n## ")
	if len(first) != 2 {
		t.Fatalf("Your first expert has %d code blocks, want 2", len(first))
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	wait := fmt.Sprintf("\nfor i in $(seq 600); do curl -s -o /dev/null http://%s/ && break; sleep 0.5; done\n", addr)
	adapt := func(block string) string {
		var out strings.Builder
		for _, line := range strings.Split(block, "\n") {
			line = strings.ReplaceAll(line, "127.0.0.1:7700", addr)
			if strings.HasPrefix(line, "moehost serve") {
				line = strings.Replace(line, "moehost serve", "moehost serve --listen "+addr, 1)
			}
			out.WriteString(line + "\n")
			if strings.HasSuffix(strings.TrimSpace(strings.Split(line, "#")[0]), "&") {
				out.WriteString(wait)
			}
		}
		return out.String()
	}
	script := "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n" +
		"moehost serve --listen " + addr + " --data-dir quickstart-data --no-dht &" + wait +
		adapt(quick[1]) + "kill %1; wait %1 || true\n" +
		adapt(first[0]) + adapt(first[1])
	t.Logf("script:\n%s", script)
	dir := t.TempDir()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	path := strings.Join([]string{binDir, filepath.Dir(grpcurl(t)), filepath.Dir(bufBinary(t)), os.Getenv("PATH")}, string(os.PathListSeparator))
	cmd.Env = append(os.Environ(), "PATH="+path, "MOEHOST_TOKEN=")
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(8 * time.Minute):
		cmd.Process.Kill()
		<-done
	}
	if err != nil {
		t.Fatalf("the README's commands failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"moehost.v1.ExpertService",            // grpcurl list
		"moehost.v1.ExpertService/Forward",    // buf curl --list-methods
		`"uid":"ffn.0"`,                       // curl Info
		"myexpert.wasm",                       // expert build
		"me.linear.0",                         // deploy
		`"outputs":[{"dtype":"DTYPE_FLOAT32"`, // curl Forward
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the README's commands printed no %q:\n%s", want, out)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// bufVersion is BUF_VERSION from the Makefile.
func bufVersion(t *testing.T) string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BUF_VERSION := (v\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no BUF_VERSION in the Makefile")
	}
	return string(m[1])
}
