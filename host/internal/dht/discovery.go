package dht

import (
	"context"
	"errors"
	"fmt"

	"github.com/moehost/moehost/sdk/swarm"
)

// Errors of the lookups that DiscoveryService asks of the node, which the
// server's Codes table maps to Connect codes.
var (
	// ErrBadQuery: a beam search that swarm.BeamSearch refuses (a bad
	// peer ID, too many peers, a score that is not finite).
	ErrBadQuery = errors.New("bad discovery query")
	// ErrLookup: the DHT could not answer (no peers, the network).
	ErrLookup = errors.New("DHT lookup failed")
)

// Find returns the live records of each name (uids or prefixes), read
// from the DHT by the node. Its errors wrap ErrLookup.
func (s *Service) Find(ctx context.Context, names []string) (map[string][]swarm.Record, error) {
	found, err := s.find(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLookup, err)
	}
	return found, nil
}

// Beam runs swarm.BeamSearch over the node's lookups: the k existing
// experts of the grid prefix with the highest sums of scores, best first,
// from the records of peers alone when peers is not empty. Its errors
// wrap ErrBadQuery, or are ctx's once ctx is done.
func (s *Service) Beam(ctx context.Context, prefix string, scores [][]float64, k int, peers []string) ([]swarm.Scored, error) {
	best, err := swarm.BeamSearch(ctx, s.find, prefix, scores, k, peers)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrBadQuery, err)
	}
	return best, nil
}
