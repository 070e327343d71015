package host

import "context"

// Deploy loads ec and serves it while the server runs: a uid that is
// already served is refused (ErrExpertServed). The expert is in
// Info, the DHT's next announcement and /metrics once Deploy returns.
func (s *Server) Deploy(ctx context.Context, ec ExpertConfig) error {
	return s.experts.Deploy(ctx, ec)
}

// Undeploy stops serving uid: its queued requests fail with Unavailable,
// a batch of it that runs finishes, and then its pools leave the worker,
// its instance and module close unless other experts share them, its
// parameters are dropped and its metric series deleted. Its checkpoints
// stay on disk, so that a later Deploy of the uid resumes from them.
func (s *Server) Undeploy(ctx context.Context, uid string) error {
	return s.experts.Undeploy(ctx, uid)
}
