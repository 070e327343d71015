package cli

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/moehost/moehost/host"
)

// dhtOption runs the DHT unless --no-dht.
func dhtOption(noDHT bool, c host.DHTConfig) host.Option {
	if noDHT {
		return host.WithoutDHT()
	}
	return host.WithDHT(c)
}

// dhtFlags configure the DHT node, which --no-dht does not run.
var dhtFlags = []string{"initial-peers", "dht-listen", "announce", "dht-store-bytes", "dht-peer-bytes"}

// noDHTAlone refuses --no-dht beside a flag that configures the DHT: the
// user asked for both a swarm (--initial-peers) and none, and silently
// dropping one leaves the server alone where it meant to join.
func noDHTAlone(f *pflag.FlagSet, noDHT bool) error {
	if !noDHT {
		return nil
	}
	for _, name := range dhtFlags {
		if f.Changed(name) {
			return fmt.Errorf("--no-dht runs no DHT node, so --%s has nothing to configure: drop one of the two", name)
		}
	}
	return nil
}
