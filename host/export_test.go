package host

import "github.com/moehost/moehost/host/internal/experts"

// TrapWasm is a tiny identity expert on x:float32[-1,4] (testdata/trap.wat):
// cheap to instantiate, for tests that start many servers.
func TrapWasm() []byte { return trapWasm }

// expert returns the expert uid, or nil.
func (s *Server) expert(uid string) *experts.Expert {
	e, _ := s.experts.Get(uid)
	return e
}
