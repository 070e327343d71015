package ui

import "net/http"

// SwarmRecord is one signed DHT record, as the swarm view shows it.
type SwarmRecord struct {
	// Name is a uid ("ffn.3") or a grid prefix ("ffn.").
	Name string `json:"name"`
	// PeerID is the server that signed it.
	PeerID string `json:"peer_id"`
	// URLs are that server's base URLs (a uid's record; none when it was
	// withdrawn).
	URLs []string `json:"urls,omitempty"`
	// Digest is the expert's module digest (a uid's record).
	Digest string `json:"digest,omitempty"`
	// ExpiresUnixMs is when the record stops being valid unless its
	// server announces it again: its liveness.
	ExpiresUnixMs int64 `json:"expires_unix_ms"`
	// QueueDepth and SamplesPerSecond are the expert's load when it was
	// announced.
	QueueDepth       int64   `json:"queue_depth"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Children are the coordinates under a prefix that its server hosts.
	Children []int32 `json:"children,omitempty"`
}

// Swarm is what the server's DHT node knows of the swarm.
type Swarm struct {
	// DHT is false when the server runs no DHT node; the rest is then
	// empty.
	DHT bool `json:"dht"`
	// Self is the server's own peer ID.
	Self string `json:"self,omitempty"`
	// NowUnixMs is the server's clock, against which the page measures
	// expiry, whatever the browser's clock says.
	NowUnixMs int64 `json:"now_unix_ms"`
	// Records are the first Limit of the Total live records the node
	// holds, by name and then signer.
	Records []SwarmRecord `json:"records"`
	Total   int           `json:"total"`
	Limit   int           `json:"limit"`
}

func serveSwarm(w http.ResponseWriter, swarm func() Swarm) {
	s := swarm()
	if s.Records == nil {
		s.Records = []SwarmRecord{}
	}
	writeJSON(w, s)
}
