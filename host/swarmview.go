package host

import (
	"sync"
	"time"

	"github.com/moehost/moehost/host/internal/ui"
)

// The dashboard's swarm view: at most swarmViewLimit records of the DHT
// node's store, computed at most once per swarmViewTTL however many pages
// ask, since a full store costs a scan and a sort of its names.
const (
	swarmViewLimit = 512
	swarmViewTTL   = time.Second
)

// swarmView caches the dashboard's view of the swarm.
type swarmView struct {
	mu   sync.Mutex
	at   time.Time
	last ui.Swarm
}

// get returns the view, made again when it is older than swarmViewTTL.
func (v *swarmView) get(s *Server) ui.Swarm {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := time.Now()
	if !v.at.IsZero() && now.Sub(v.at) < swarmViewTTL {
		return v.last
	}
	v.at, v.last = now, s.swarmNow(now)
	return v.last
}

// swarmNow reads the DHT node's store.
func (s *Server) swarmNow(now time.Time) ui.Swarm {
	s.mu.Lock()
	d := s.dht
	s.mu.Unlock()
	if d == nil {
		return ui.Swarm{NowUnixMs: now.UnixMilli()}
	}
	recs, total := d.StoredRecords(swarmViewLimit)
	out := ui.Swarm{DHT: true, Self: d.PeerID(), NowUnixMs: now.UnixMilli(), Total: total, Limit: swarmViewLimit,
		Records: make([]ui.SwarmRecord, len(recs))}
	for i, r := range recs {
		out.Records[i] = ui.SwarmRecord{Name: r.Name, PeerID: r.PeerID, URLs: r.URLs, Digest: r.Digest,
			ExpiresUnixMs: r.Expires.UnixMilli(), QueueDepth: r.QueueDepth, SamplesPerSecond: r.SamplesPerSecond, Children: r.Children}
	}
	return out
}
