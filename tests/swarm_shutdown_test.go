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

// TestSwarmShutdownWithdraws stops one of two `moehost serve` processes
// with SIGTERM: its records are withdrawn, so discovery through the other
// server stops returning it within a few seconds, long before the
// records' 20 s expiry.
func TestSwarmShutdownWithdraws(t *testing.T) {
	t.Parallel()
	const period, expiry = 10 * time.Second, 20 * time.Second
	a := serve(t, "--experts", "ffn.[0:2]", "--update-period", period.String())
	b := serve(t, "--experts", "ffn.[1:3]", "--update-period", period.String(), "--initial-peers", a.addrs[0])
	dc := client.NewDiscoveryClient(b.url)
	defer dc.Close()
	find := func(want string) func() (bool, string) {
		return func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			found, err := dc.Discover(ctx, []string{"ffn."})
			if err != nil {
				return false, err.Error()
			}
			got := map[string][]string{}
			for uid, eps := range found {
				got[uid] = urlsOf(eps)
			}
			return fmt.Sprint(got) == want, fmt.Sprint(got)
		}
	}
	both := fmt.Sprint(map[string][]string{"ffn.0": {a.url}, "ffn.1": slices.Sorted(slices.Values([]string{a.url, b.url})), "ffn.2": {b.url}})
	waitFor(t, 30*time.Second, "both servers discoverable", find(both))
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, expiry/2, "a stopped server's records withdrawn", find(fmt.Sprint(map[string][]string{"ffn.1": {b.url}, "ffn.2": {b.url}})))
	t.Logf("gone from discovery %v after SIGTERM (records expire after %v)", took.Round(time.Millisecond), expiry)
}
