package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/moehost/moehost/sdk/client"
)

func discoverCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		initialPeers []string
		server       string
		timeout      time.Duration
		trust        []string
		limit        int
		ca           caFlag
	)
	cmd := &cobra.Command{
		Use:   "discover UID_OR_PREFIX...",
		Short: "Find experts in the DHT swarm",
		Long: `Find experts in the DHT swarm by uid ("ffn.3.14") or grid prefix ("ffn.",
"ffn.3."), and print one line per live endpoint: UID<TAB>ENDPOINT<TAB>PEERID.

A prefix is resolved a page of lookups at a time, and each page is
printed as it comes, up to --limit uids. It joins the swarm through
--initial-peers (a server's dht-addrs file lists its multiaddrs), or asks
the DiscoveryService of the server at --server.
--trust pins the host keys to believe: only endpoints whose record is
signed by one of these peer IDs are printed. It exits 1 when nothing is
found.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			if (len(initialPeers) == 0) == (server == "") {
				return errors.New("give either --initial-peers or --server")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var dir client.Directory
			if server != "" {
				conf, err := ca.config(cmd.Flags())
				if err != nil {
					return err
				}
				d := client.NewDiscoveryClient(server, client.WithTLSConfig(conf))
				defer d.Close()
				dir = d
			} else {
				s, err := client.NewSwarm(ctx, initialPeers)
				if err != nil {
					return err
				}
				defer s.Close()
				dir = s
			}
			// Pages are printed as they come, so that a prefix with many
			// children (or records listing children nobody hosts) shows
			// what it found before the timeout or the limit.
			printed := 0
			err := dir.DiscoverPages(ctx, names, func(page map[string][]client.Endpoint) bool {
				for _, uid := range mapKeys(page) {
					eps := page[uid]
					if len(trust) > 0 {
						eps = slices.DeleteFunc(eps, func(e client.Endpoint) bool { return !slices.Contains(trust, e.PeerID) })
					}
					if len(eps) == 0 {
						continue
					}
					if printed == limit {
						return false
					}
					printed++
					for _, e := range eps {
						fmt.Fprintf(stdout, "%s\t%s\t%s\n", uid, e.URL, e.PeerID)
					}
				}
				return true
			})
			if err != nil && printed == 0 {
				return err
			}
			if err != nil {
				fmt.Fprintf(stderr, "moehost: discover stopped after %d uids: %v\n", printed, err)
			}
			if printed == 0 {
				if len(trust) > 0 {
					return fmt.Errorf("no live endpoint of %v signed by a trusted peer", names)
				}
				return fmt.Errorf("no live endpoint of %v", names)
			}
			if printed == limit {
				fmt.Fprintf(stderr, "moehost: stopped at --limit %d uids\n", limit)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&initialPeers, "initial-peers", nil, "multiaddrs (with /p2p/) of DHT peers to join through, comma-separated")
	f.StringVar(&server, "server", "", "base URL of a server whose DiscoveryService to ask instead of joining the swarm (https:// for TLS)")
	ca.register(f)
	f.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	f.IntVar(&limit, "limit", 4096, "print at most this many uids")
	f.StringSliceVar(&trust, "trust", nil, "peer IDs (host keys) whose records to believe, comma-separated; default any")
	return cmd
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
