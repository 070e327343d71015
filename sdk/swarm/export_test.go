package swarm

import (
	"time"

	"context"

	ds "github.com/ipfs/go-datastore"
	record "github.com/libp2p/go-libp2p-record"
)

// acceptAll is the validator of a malicious peer: it stores and sends
// anything.
type acceptAll struct{}

func (acceptAll) Validate(string, []byte) error        { return nil }
func (acceptAll) Select(string, [][]byte) (int, error) { return 0, nil }

// WithDatastore makes the node keep its records in store, for the test to
// read.
func WithDatastore(cfg Config, store ds.Batching) Config {
	cfg.datastore = store
	return cfg
}

// Malicious makes the node accept and send records that Validator
// rejects.
func Malicious(cfg Config) Config {
	cfg.validator = acceptAll{}
	return cfg
}

// PutRaw stores value under key in the DHT without signing or checking it.
func (n *Node) PutRaw(ctx context.Context, key string, value []byte) error {
	return n.dht.PutValue(ctx, key, value)
}

// Sign is Identity.Sign without setting the peer ID, to forge records.
func SignAs(i *Identity, r Record) ([]byte, error) { return i.sign(r) }

var _ record.Validator = acceptAll{}

// NewStore returns the bounded DHT store of a node with peer ID self.
func NewStore(self string, limit, peerLimit int64) ds.Batching {
	return newStore(self, limit, peerLimit)
}

// StatsOf returns the stats of a store made by NewStore.
func StatsOf(s ds.Batching) StoreStats { return s.(*store).Stats() }

// SetStoreClock sets the clock of a store made by NewStore.
func SetStoreClock(s ds.Batching, now func() time.Time) { s.(*store).now = now }

// RecordsOf calls records on a store made by NewStore.
func RecordsOf(s ds.Batching, limit int) ([]Record, int) { return s.(*store).records(limit) }

// AskedOf returns how many record requests n has served.
func AskedOf(n *Node) int64 { return n.asked.Load() }

// ConnectedTo reports whether n has a connection to the peer id.
func ConnectedTo(n *Node, id string) bool {
	for _, p := range n.h.Network().Peers() {
		if p.String() == id {
			return true
		}
	}
	return false
}
