package host

import (
	"testing"

	"github.com/moehost/moehost/modules"
)

// TestTenantsStartAtLowPriority checks which runtimes start their
// instances at nice 19 with a CPU-time init timeout: a tenant's, never the
// operator's.
func TestTenantsStartAtLowPriority(t *testing.T) {
	srv := startTenantsServer(t)
	if srv.guestLimits(modules.Operator).LowPriorityInit {
		t.Error("the operator's experts start at low priority")
	}
	for _, name := range []string{"alice", "bob"} {
		if !srv.guestLimits(name).LowPriorityInit {
			t.Errorf("tenant %s's experts start at normal priority", name)
		}
	}
}
