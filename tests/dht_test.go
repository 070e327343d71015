package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/client"
	"github.com/moehost/moehost/sdk/swarm"
)

// grpcurlVersion is the grpcurl the tests build (into .tmp/bin) and run.
const grpcurlVersion = "v1.9.4"

// moehostBinary builds the moehost binary once per test run.
func moehostBinary(t *testing.T) string {
	t.Helper()
	return buildMoehost(t, "")
}

// grpcurl builds the pinned grpcurl into .tmp/bin once.
func grpcurl(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".tmp", "bin", "grpcurl-"+grpcurlVersion))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "grpcurl")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "github.com/fullstorydev/grpcurl/cmd/grpcurl@"+grpcurlVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install grpcurl: %v\n%s", err, out)
	}
	return bin
}

// served is a `moehost serve` process.
type served struct {
	cmd   *exec.Cmd
	url   string
	addrs []string // its DHT multiaddrs, from dht-addrs
	mu    sync.Mutex
	log   []string
}

func (s *served) logText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.log, "\n")
}

// serve starts `moehost serve` with args on a fresh data dir and waits
// until it is ready.
func serve(t *testing.T, args ...string) *served {
	t.Helper()
	return serveIn(t, t.TempDir(), args...)
}

// serveIn is serve on the given data dir, as a restart runs it.
func serveIn(t *testing.T, dataDir string, args ...string) *served {
	t.Helper()
	cmd := exec.Command(moehostBinary(t), append([]string{"serve", "--listen", "127.0.0.1:*", "--data-dir", dataDir,
		"--module", "nop", "--hidden-dim", "4"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &served{cmd: cmd}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan string, 1)
	re := regexp.MustCompile(`msg="moehost serving" addr=(\S+)`)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.log = append(s.log, sc.Text())
			s.mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				scheme := "http://"
				if strings.Contains(sc.Text(), " tls=true") {
					scheme = "https://"
				}
				ready <- scheme + m[1]
			}
		}
		close(ready)
	}()
	select {
	case url, ok := <-ready:
		if !ok {
			t.Fatalf("serve exited before serving:\n%s", s.logText())
		}
		s.url = url
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve did not start:\n%s", s.logText())
	}
	if slices.Contains(args, "--no-dht") {
		return s
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "dht-addrs"))
	if err != nil {
		t.Fatalf("dht-addrs not written before ready: %v", err)
	}
	s.addrs = strings.Fields(string(b))
	if len(s.addrs) == 0 {
		t.Fatal("dht-addrs is empty")
	}
	return s
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	begin := time.Now()
	var last string
	for time.Since(begin) < within {
		ok, state := cond()
		if ok {
			return time.Since(begin)
		}
		last = state
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v; last: %s", what, within, last)
	return 0
}

func urlsOf(eps []client.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.URL)
	}
	slices.Sort(out)
	return out
}

// TestDHTSwarm runs a swarm of 8 DHT server nodes on loopback: 6 bare
// nodes and two `moehost serve` processes that both host ffn.1. A client
// node that knows one bare node finds every uid with every endpoint,
// through the Go client, `moehost discover`, DiscoveryService over
// connect-go and grpcurl; once one server is SIGKILLed its uids vanish
// within the record expiry.
func TestDHTSwarm(t *testing.T) {
	t.Parallel()
	// Build the tools first: on a fresh machine that takes minutes, which
	// must not eat the swarm's deadlines.
	grpcurlBin := grpcurl(t)
	moehostBinary(t)
	var nodes []*swarm.Node
	for i := range 6 {
		cfg := swarm.Config{}
		if i > 0 {
			cfg.InitialPeers = nodes[0].Addrs()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := swarm.NewNode(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	const period, expiry = time.Second, 3 * time.Second // expiry = max(2×period, 3s)
	a := serve(t, "--experts", "ffn.[0:2]", "--update-period", period.String(), "--initial-peers", strings.Join(nodes[1].Addrs(), ","))
	b := serve(t, "--experts", "ffn.[1:3]", "--update-period", period.String(), "--initial-peers", strings.Join(a.addrs, ","))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sw, err := client.NewSwarm(ctx, nodes[5].Addrs(), client.WithCacheTTL(0), client.WithNegativeTTL(0))
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	want := map[string][]string{"ffn.0": {a.url}, "ffn.1": {a.url, b.url}, "ffn.2": {b.url}}
	for _, urls := range want {
		slices.Sort(urls)
	}
	check := func(want map[string][]string) func() (bool, string) {
		return func() (bool, string) {
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			found, err := sw.Discover(lctx, []string{"ffn."})
			if err != nil {
				return false, err.Error()
			}
			got := map[string][]string{}
			for uid, eps := range found {
				got[uid] = urlsOf(eps)
			}
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
		}
	}
	took := waitFor(t, 20*time.Second, "every uid discoverable from a client knowing one peer", check(want))
	t.Logf("all uids discoverable %v after both servers were ready", took)

	// moehost discover, through the swarm and through a server.
	for _, via := range [][]string{{"--initial-peers", strings.Join(nodes[3].Addrs(), ",")}, {"--server", b.url}} {
		out, err := exec.Command(moehostBinary(t), append(append([]string{"discover"}, via...), "ffn.1", "ffn.0")...).Output()
		if err != nil {
			t.Fatalf("moehost discover %v: %v", via, err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 3 || !strings.HasPrefix(lines[0], "ffn.0\t"+a.url+"\t") || !strings.HasPrefix(lines[1], "ffn.1\t") {
			t.Errorf("moehost discover %v printed:\n%s", via, out)
		}
		for _, l := range lines {
			if f := strings.Split(l, "\t"); len(f) != 3 || !strings.HasPrefix(f[2], "12D3") {
				t.Errorf("line %q is not UID<TAB>ENDPOINT<TAB>PEERID", l)
			}
		}
	}
	cmd := exec.Command(moehostBinary(t), "discover", "--server", a.url, "nothing.")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(stderr.String(), "no live endpoint") {
		t.Errorf("discover of nothing: %v, stderr %q; want exit 1 with a message", err, stderr.String())
	}

	// DiscoveryService through connect-go (gRPC protocol) and grpcurl.
	dc := moehostv1connect.NewDiscoveryServiceClient(http.DefaultClient, a.url)
	res, err := dc.FindExperts(ctx, connect.NewRequest(&moehostv1.FindExpertsRequest{Names: []string{"ffn.1", "ffn."}}))
	if err != nil {
		t.Fatal(err)
	}
	if f := res.Msg.GetFound(); len(f) != 2 || len(f[0].GetEndpoints()) != 2 || !slices.Equal(f[1].GetChildren(), []int32{0, 1, 2}) {
		t.Errorf("FindExperts = %v", res.Msg)
	}
	out, err := exec.Command(grpcurlBin, "-plaintext", "-d", `{"prefix":"ffn","grid_scores":[{"values":[0.1,0.5,0.3]}],"k":2}`,
		strings.TrimPrefix(a.url, "http://"), "moehost.v1.DiscoveryService/BeamSearch").CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl: %v\n%s", err, out)
	}
	if s := string(out); !regexp.MustCompile(`(?s)"uid": "ffn.1".*"uid": "ffn.2"`).MatchString(s) || strings.Contains(s, `"ffn.0"`) {
		t.Errorf("grpcurl BeamSearch printed:\n%s", s)
	}

	// SIGKILL b: its uids vanish within the expiry.
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	gone := map[string][]string{"ffn.0": {a.url}, "ffn.1": {a.url}}
	waitFor(t, expiry+5*time.Second, "killed server's uids vanish", check(gone))
	vanished := time.Since(killed)
	t.Logf("killed server's records vanished %v after SIGKILL (expiry %v)", vanished, expiry)
	// Lookups take a moment; the records must be gone within the expiry
	// plus one polling round.
	if vanished > expiry+time.Second {
		t.Errorf("vanished after %v, later than the expiry %v", vanished, expiry)
	}
}
