package cli

import (
	"github.com/spf13/pflag"

	"github.com/moehost/moehost/host"
)

// hivemindFlags are serve's flags for hivemind 1.x clients.
type hivemindFlags struct {
	on  bool
	cfg host.HivemindConfig
}

func (h *hivemindFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&h.on, "hivemind", false, "also serve the experts to unmodified hivemind 1.x clients (expert RPC and DHT over libp2p); the multiaddrs to pass as initial_peers are logged and written to <data-dir>/hivemind-addrs")
	f.StringSliceVar(&h.cfg.Listen, "hivemind-listen", nil, "libp2p multiaddrs for the hivemind node; default a free TCP port on the --listen host")
	f.StringSliceVar(&h.cfg.InitialPeers, "hivemind-initial-peers", nil, "multiaddrs (with /p2p/) of hivemind DHT peers to join, comma-separated; default none")
}

func (h *hivemindFlags) option() host.Option {
	if !h.on {
		return host.WithoutHivemind()
	}
	return host.WithHivemind(h.cfg)
}
