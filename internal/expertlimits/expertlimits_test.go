package expertlimits

import (
	"testing"
	"time"
)

func TestOver(t *testing.T) {
	t.Parallel()
	base := Limits{MemoryPages: 64, CallTimeout: time.Minute, BytesPerCall: 1 << 30, ParamBytes: 1 << 32}
	tests := []struct {
		name string
		own  Limits
		want Limits
	}{
		{"none", Limits{}, base},
		{"pages", Limits{MemoryPages: 8}, Limits{MemoryPages: 8, CallTimeout: time.Minute, BytesPerCall: 1 << 30, ParamBytes: 1 << 32}},
		{"timeout", Limits{CallTimeout: time.Second}, Limits{MemoryPages: 64, CallTimeout: time.Second, BytesPerCall: 1 << 30, ParamBytes: 1 << 32}},
		{"bytes", Limits{BytesPerCall: 5}, Limits{MemoryPages: 64, CallTimeout: time.Minute, BytesPerCall: 5, ParamBytes: 1 << 32}},
		{"params", Limits{ParamBytes: 7}, Limits{MemoryPages: 64, CallTimeout: time.Minute, BytesPerCall: 1 << 30, ParamBytes: 7}},
		{"negative is not a limit", Limits{CallTimeout: -1, BytesPerCall: -1, ParamBytes: -1}, base},
	}
	for _, tt := range tests {
		if got := tt.own.Over(base); got != tt.want {
			t.Errorf("%s: %+v over %+v = %+v, want %+v", tt.name, tt.own, base, got, tt.want)
		}
	}
	if !(Limits{}).IsZero() || (Limits{ParamBytes: 1}).IsZero() {
		t.Error("IsZero")
	}
}
