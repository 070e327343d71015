package tests

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// grpcurlVersion pins the grpcurl the test builds from the Go module
// proxy, so that the test means the same thing on every machine.
const grpcurlVersion = "v1.9.3"

// grpcurl returns the pinned grpcurl, building it into the repository's
// .tmp/bin on first use (Go alone is needed).
func grpcurl(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("..", ".tmp", "bin", "grpcurl-"+grpcurlVersion))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	dir := t.TempDir()
	install := exec.Command("go", "install", "github.com/fullstorydev/grpcurl/cmd/grpcurl@"+grpcurlVersion)
	install.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install grpcurl@%s: %v\n%s", grpcurlVersion, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	// Rename, so that parallel runs never see half a binary.
	if err := os.Rename(filepath.Join(dir, "grpcurl"), bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// serve builds moehost, starts `moehost serve` with args and returns its
// address; the server is killed when the test ends.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "moehost")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/moehost").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:*", "--data-dir", filepath.Join(dir, "data")}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addrRE := regexp.MustCompile(`msg="moehost serving" addr=(\S+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		close(found)
	}()
	select {
	case addr, ok := <-found:
		if !ok {
			t.Fatal("serve exited before serving")
		}
		return addr
	case <-time.After(2 * time.Minute):
		t.Fatal("serve did not start")
	}
	return ""
}

// TestGRPCurl lists, describes and calls the server with grpcurl, a
// client we did not write, through server reflection only.
func TestGRPCurl(t *testing.T) {
	t.Parallel()
	gc := grpcurl(t)
	addr := serve(t, "--experts", "nop.[0:2]", "--module", "nop", "--hidden-dim", "4")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(gc, append([]string{"-plaintext"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	list := run(addr, "list")
	for _, svc := range []string{"moehost.v1.ExpertService", "grpc.health.v1.Health"} {
		if !strings.Contains(list, svc) {
			t.Errorf("grpcurl list does not show %s:\n%s", svc, list)
		}
	}
	// The comments come from the source info in the reflected descriptors.
	for sym, comment := range map[string]string{
		"moehost.v1.ExpertService.Forward": "Forward runs the expert on a batch of inputs",
		"moehost.v1.ForwardRequest":        "output_dtype asks for the float32 outputs",
		"moehost.v1.DType":                 "DTYPE_BFLOAT16 is bfloat16",
	} {
		if out := run(addr, "describe", sym); !strings.Contains(out, comment) {
			t.Errorf("grpcurl describe %s does not show the comment %q:\n%s", sym, comment, out)
		}
	}
	x := make([]byte, 16)
	for i, v := range []float32{1, -2, 3.5, 4} {
		binary.LittleEndian.PutUint32(x[4*i:], math.Float32bits(v))
	}
	body := `{"uid": "nop.1", "inputs": [{"dtype": "DTYPE_FLOAT32", "shape": [1, 4], "data": "` + base64.StdEncoding.EncodeToString(x) + `"}]}`
	out := run("-d", body, addr, "moehost.v1.ExpertService/Forward")
	// nop returns its input.
	if !strings.Contains(out, base64.StdEncoding.EncodeToString(x)) || !strings.Contains(out, `"DTYPE_FLOAT32"`) {
		t.Errorf("grpcurl Forward did not return the input:\n%s", out)
	}
	// A bad call gets its code and a message that does not repeat it.
	cmd := exec.Command(gc, "-plaintext", "-d", `{"uid": "nope"}`, addr, "moehost.v1.ExpertService/Forward")
	bad, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(bad), "NotFound") || !strings.Contains(string(bad), "ListExperts") {
		t.Errorf("grpcurl Forward of an unknown uid: %v\n%s", err, bad)
	}
}
