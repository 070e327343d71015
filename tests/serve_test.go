package tests

import (
	"bufio"
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// TestServeShutsDownOnSignal runs the real binary, calls it, sends SIGTERM
// and checks that it exits cleanly and promptly.
func TestServeShutsDownOnSignal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := buildMoehost(t, dir) // shared by the package's tests: built once
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:*", "--data-dir", filepath.Join(dir, "data"),
		"--experts", "ffn.[0:2]", "--hidden-dim", "16")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	addrRE := regexp.MustCompile(`msg="moehost serving" addr=(\S+)`)
	var addr string
	var log []string
	timeout := time.After(2 * time.Minute)
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve exited before serving:\n%s", strings.Join(log, "\n"))
			}
			log = append(log, l)
			if m := addrRE.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
		case <-timeout:
			t.Fatalf("serve did not start:\n%s", strings.Join(log, "\n"))
		}
	}
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+addr)
	res, err := c.ListExperts(context.Background(), connect.NewRequest(&moehostv1.ListExpertsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Msg.GetExperts()); n != 2 {
		t.Fatalf("serving %d experts, want 2", n)
	}

	begin := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for l := range lines {
			log = append(log, l)
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v:\n%s", err, strings.Join(log, "\n"))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not exit within 30s of SIGTERM")
	}
	if !strings.Contains(strings.Join(log, "\n"), `msg="moehost stopped" err=<nil>`) {
		t.Errorf("no clean stop in the log:\n%s", strings.Join(log, "\n"))
	}
	t.Logf("exited %v after SIGTERM", time.Since(begin))
}
