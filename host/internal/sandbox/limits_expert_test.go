package sandbox

import (
	"testing"
	"time"

	"github.com/moehost/moehost/internal/expertlimits"
)

// TestLimitsWithExpert: an expert's own limits replace exactly the four
// per-expert fields of its owner's, and Expert reads them back.
func TestLimitsWithExpert(t *testing.T) {
	t.Parallel()
	base := Limits{MemoryPages: 64, CallTimeout: time.Minute, BytesPerCall: 1 << 30, ParamBytes: 1 << 32, OpsPerCall: 7, InitTimeout: time.Second}
	own := expertlimits.Limits{MemoryPages: 8, CallTimeout: time.Second, BytesPerCall: 5, ParamBytes: 9}
	got := base.WithExpert(own)
	want := Limits{MemoryPages: 8, CallTimeout: time.Second, BytesPerCall: 5, ParamBytes: 9, OpsPerCall: 7, InitTimeout: time.Second}
	if got != want {
		t.Errorf("WithExpert = %+v, want %+v", got, want)
	}
	if e := got.Expert(); e != own {
		t.Errorf("Expert = %+v, want %+v", e, own)
	}
	if got := base.WithExpert(expertlimits.Limits{}); got != base {
		t.Errorf("WithExpert of nothing = %+v, want %+v", got, base)
	}
}
