package host

import (
	"slices"
	"strings"
	"testing"
)

func TestParseDeviceSpec(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		spec    string
		gpus    []int
		wantErr string
	}{
		{name: "empty is the CPU", spec: ""},
		{name: "cpu", spec: "cpu"},
		{name: "cuda is GPU 0", spec: "cuda", gpus: []int{0}},
		{name: "one ordinal", spec: "cuda:3", gpus: []int{3}},
		{name: "several in order", spec: "cuda:1,0, 2", gpus: []int{1, 0, 2}},
		{name: "unknown kind", spec: "gpu", wantErr: "want cpu, cuda"},
		{name: "cuda with no ordinal", spec: "cuda:", wantErr: `"" is not a GPU ordinal`},
		{name: "negative", spec: "cuda:-1", wantErr: `"-1" is not a GPU ordinal`},
		{name: "too large", spec: "cuda:64", wantErr: `"64" is not a GPU ordinal`},
		{name: "not a number", spec: "cuda:x", wantErr: `"x" is not a GPU ordinal`},
		{name: "listed twice", spec: "cuda:0,1,0", wantErr: "GPU 0 is listed twice"},
		{name: "case matters", spec: "CUDA:0", wantErr: "want cpu, cuda"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ds, err := parseDeviceSpec(tt.spec)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseDeviceSpec(%q) = %v, %v; want an error with %q", tt.spec, ds.gpus, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(ds.gpus, tt.gpus) {
				t.Fatalf("parseDeviceSpec(%q) = %v, %v; want %v", tt.spec, ds.gpus, err, tt.gpus)
			}
		})
	}
}
