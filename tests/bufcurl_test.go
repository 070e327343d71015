package tests

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// TestBufCurl lists and calls the server with buf curl, the second
// client we did not write, through server reflection only, over each of
// the three protocols the port speaks.
func TestBufCurl(t *testing.T) {
	t.Parallel()
	buf := bufBinary(t)
	base := serve(t, "--experts", "nop.[0:2]").url
	run := func(args ...string) (string, error) {
		t.Helper()
		out, err := exec.Command(buf, append([]string{"curl"}, args...)...).CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("buf curl %v: %v\n%s", args, err, out)
		}
		return out
	}
	services := must("--list-services", base)
	for _, svc := range []string{"moehost.v1.ExpertService", "moehost.v1.ServerService", "moehost.v1.DiscoveryService", "grpc.health.v1.Health"} {
		if !strings.Contains(services, svc+"\n") {
			t.Errorf("buf curl --list-services does not show %s:\n%s", svc, services)
		}
	}
	// Listing methods resolves every listed service's descriptors.
	methods := must("--list-methods", base)
	for _, m := range []string{"moehost.v1.ExpertService/Forward", "moehost.v1.ExpertService/Backward", "moehost.v1.DiscoveryService/BeamSearch", "grpc.health.v1.Health/Check"} {
		if !strings.Contains(methods, m+"\n") {
			t.Errorf("buf curl --list-methods does not show %s:\n%s", m, methods)
		}
	}

	x := make([]byte, 16)
	for i, v := range []float32{1, -2, 3.5, 4} {
		binary.LittleEndian.PutUint32(x[4*i:], math.Float32bits(v))
	}
	data := base64.StdEncoding.EncodeToString(x)
	body := `{"uid": "nop.1", "inputs": [{"dtype": "DTYPE_FLOAT32", "shape": [1, 4], "data": "` + data + `"}]}`
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			out := must("--protocol", protocol, "--http2-prior-knowledge", "-d", body, base+"/moehost.v1.ExpertService/Forward")
			// nop returns its input.
			if !strings.Contains(out, `"data": "`+data+`"`) || !strings.Contains(out, `"DTYPE_FLOAT32"`) {
				t.Errorf("Forward did not return the input:\n%s", out)
			}
			out = must("--protocol", protocol, "--http2-prior-knowledge", base+"/grpc.health.v1.Health/Check")
			if !strings.Contains(out, "SERVING_STATUS_SERVING") {
				t.Errorf("Health/Check:\n%s", out)
			}
			// A bad call gets its code, and a message that names the uids
			// served and does not repeat the code.
			out, err := run("--protocol", protocol, "--http2-prior-knowledge", "-d", `{"uid": "nope"}`, base+"/moehost.v1.ExpertService/Forward")
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !strings.Contains(out, `"not_found"`) || !strings.Contains(out, "ListExperts") ||
				strings.Contains(out, "not found: ") {
				t.Errorf("Forward of an unknown uid: %v\n%s", err, out)
			}
		})
	}
}

var (
	bufOnce sync.Once
	bufPath string
	bufErr  error
)

// bufBinary builds the buf that make generate pins (BUF_VERSION in the
// Makefile, the one place it is written) into .tmp/bin once.
func bufBinary(t *testing.T) string {
	t.Helper()
	bufOnce.Do(func() {
		mk, err := os.ReadFile(filepath.Join("..", "Makefile"))
		if err != nil {
			bufErr = err
			return
		}
		m := regexp.MustCompile(`(?m)^BUF_VERSION := (v\S+)$`).FindSubmatch(mk)
		if m == nil {
			bufErr = errors.New("no BUF_VERSION in the Makefile")
			return
		}
		dir, err := filepath.Abs(filepath.Join("..", ".tmp", "bin", "buf-"+string(m[1])))
		if err != nil {
			bufErr = err
			return
		}
		bufPath = filepath.Join(dir, "buf")
		if _, err := os.Stat(bufPath); err == nil {
			return
		}
		cmd := exec.Command("go", "install", "github.com/bufbuild/buf/cmd/buf@"+string(m[1]))
		cmd.Env = append(os.Environ(), "GOBIN="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			bufErr = errors.New("go install buf: " + err.Error() + "\n" + string(out))
		}
	})
	if bufErr != nil {
		t.Fatal(bufErr)
	}
	return bufPath
}
