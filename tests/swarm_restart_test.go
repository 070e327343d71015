package tests

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/moehost/moehost/sdk/client"
)

// TestSwarmRestartedBootstrapRejoins restarts, on its data dir, the
// `moehost serve` that another joined through: it comes back at the same
// DHT multiaddrs, and within 2 × update period of its restart each server
// discovers both servers' experts again.
func TestSwarmRestartedBootstrapRejoins(t *testing.T) {
	t.Parallel()
	const period = 2 * time.Second
	dir := t.TempDir()
	boot := serveIn(t, dir, "--experts", "rejoin.0", "--update-period", period.String())
	joiner := serve(t, "--experts", "rejoin.1", "--update-period", period.String(), "--initial-peers", boot.addrs[0])
	sees := func(servers ...*served) func() (bool, string) {
		want := fmt.Sprint(map[string][]string{"rejoin.0": {servers[0].url}, "rejoin.1": {servers[1].url}})
		return func() (bool, string) {
			for _, s := range servers {
				dc := client.NewDiscoveryClient(s.url)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				found, err := dc.Discover(ctx, []string{"rejoin.0", "rejoin.1"})
				cancel()
				dc.Close()
				if err != nil {
					return false, err.Error()
				}
				got := map[string][]string{}
				for uid, eps := range found {
					got[uid] = urlsOf(eps)
				}
				if fmt.Sprint(got) != want {
					return false, fmt.Sprintf("%s finds %v, want %s", s.url, got, want)
				}
			}
			return true, ""
		}
	}
	waitFor(t, 30*time.Second, "both servers discoverable", sees(boot, joiner))

	if err := boot.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := boot.cmd.Wait(); err != nil {
		t.Fatalf("the bootstrap server's shutdown: %v\n%s", err, boot.logText())
	}
	again := serveIn(t, dir, "--experts", "rejoin.0", "--update-period", period.String())
	if !slices.Equal(again.addrs, boot.addrs) {
		t.Errorf("restarted at %v, was at %v", again.addrs, boot.addrs)
	}
	took := waitFor(t, 2*period, "both servers discoverable after the restart", sees(again, joiner))
	t.Logf("healed %v after the restart", took.Round(time.Millisecond))
}
