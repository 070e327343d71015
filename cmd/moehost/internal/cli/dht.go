package cli

import (
	"github.com/moehost/moehost/host"
)

// dhtOption runs the DHT unless --no-dht.
func dhtOption(noDHT bool, c host.DHTConfig) host.Option {
	if noDHT {
		return host.WithoutDHT()
	}
	return host.WithDHT(c)
}
