package tests

import (
	"bytes"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// trapExperts serves host/testdata/trap.wasm (an identity on
// x:float32[-1,4] that loops forever, never calling the host again, when
// its input's first element is below -100) as trap.0 and trap.1 of the
// operator (`--module`, no tenants), and returns its client.
func trapExperts(t *testing.T, args ...string) (*exec.Cmd, moehostv1connect.ExpertServiceClient) {
	t.Helper()
	bin := buildMoehost(t, "")
	cmd, addr := startServe(t, bin, append([]string{"--data-dir", t.TempDir(), "--no-dht",
		"--module", "../host/testdata/trap.wasm", "--experts", "trap.[0:2]"}, args...)...)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+addr)
}

var (
	goodRow = f32Tensor([]int64{1, 4}, []float32{1, 2, 3, 4})
	spinRow = f32Tensor([]int64{1, 4}, []float32{-1000, 0, 0, 0})
)

// worstOf calls trap.1 n times with goodRow, checks each answer, and
// returns the slowest call.
func worstOf(t *testing.T, c moehostv1connect.ExpertServiceClient, n int) time.Duration {
	t.Helper()
	var worst time.Duration
	for range n {
		start := time.Now()
		got, err := forward(c, "trap.1", goodRow)
		worst = max(worst, time.Since(start))
		if err != nil {
			t.Fatalf("trap.1 beside a spinning trap.0: %v", err)
		}
		if !bytes.Equal(got, goodRow.Data) {
			t.Fatal("trap.1 answered something else than its input")
		}
	}
	return worst
}

// TestSpinningGuestOfTheOperator: with --module (the operator's experts
// all in one scheduling group), a guest that spins without calling the
// host ends with DeadlineExceeded at its call timeout and is quarantined,
// and the same module's other expert is served meanwhile within 500 ms of
// its unloaded latency (the design's bound is one kernel step or 100 ms;
// the slack is for a loaded 2-core box). Before, it waited out the call
// timeout.
func TestSpinningGuestOfTheOperator(t *testing.T) {
	const callTimeout = 4 * time.Second
	_, c := trapExperts(t, "--call-timeout", callTimeout.String())
	unloaded := worstOf(t, c, 20)

	var (
		wg      sync.WaitGroup
		spinErr error
		took    time.Duration
	)
	wg.Go(func() {
		start := time.Now()
		_, spinErr = forward(c, "trap.0", spinRow)
		took = time.Since(start)
	})
	time.Sleep(300 * time.Millisecond) // trap.0 is spinning
	beside := worstOf(t, c, 30)
	wg.Wait()
	t.Logf("trap.1's worst call: %v unloaded, %v beside the spinning guest; the spinning call ended after %v with %v", unloaded, beside, took, spinErr)
	if bound := unloaded + 500*time.Millisecond; beside > bound {
		t.Errorf("trap.1's worst call beside a spinning trap.0 took %v, past %v", beside, bound)
	}
	if connect.CodeOf(spinErr) != connect.CodeDeadlineExceeded || !strings.Contains(spinErr.Error(), "call timeout") {
		t.Errorf("the spinning call: %v, want DeadlineExceeded naming the call timeout", spinErr)
	}
	if took > callTimeout+2*time.Second {
		t.Errorf("the spinning call ended after %v, its call timeout is %v", took, callTimeout)
	}
	if _, err := forward(c, "trap.0", goodRow); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "quarantined") {
		t.Errorf("trap.0 after its timeout: %v, want Unavailable (quarantined)", err)
	}
}

// TestShutdownStopsASpinningGuest: SIGTERM while a guest spins (its call
// timeout a minute away) ends the server within --drain-timeout: the
// batch in flight is cancelled at the drain's end, not at its call
// timeout.
func TestShutdownStopsASpinningGuest(t *testing.T) {
	const drain = 2 * time.Second
	cmd, c := trapExperts(t, "--call-timeout", "1m", "--drain-timeout", drain.String())
	spun := make(chan error, 1)
	go func() {
		_, err := forward(c, "trap.0", spinRow)
		spun <- err
	}()
	time.Sleep(300 * time.Millisecond)
	begin := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Logf("serve exited %v after SIGTERM (%v)", time.Since(begin), err)
		if took := time.Since(begin); took > drain+5*time.Second {
			t.Errorf("serve exited %v after SIGTERM, its drain timeout is %v", took, drain)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("serve did not exit within 40 s of SIGTERM while a guest spun")
	}
	select {
	case err := <-spun:
		if err == nil {
			t.Error("the spinning call succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Error("the spinning call did not end with the server")
	}
}
