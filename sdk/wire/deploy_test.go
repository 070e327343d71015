package wire_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/wire"
)

// TestAccess round-trips each access through its name and its wire form.
func TestAccess(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want wire.Access
		pb   moehostv1.Access
	}{
		{"public", "public", wire.AccessPublic, moehostv1.Access_ACCESS_PUBLIC},
		{"owner in capitals", "OWNER", wire.AccessOwner, moehostv1.Access_ACCESS_OWNER},
		{"tenants", "tenants", wire.AccessTenants, moehostv1.Access_ACCESS_TENANTS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := wire.ParseAccess(tt.in)
			if err != nil || a != tt.want || !strings.EqualFold(a.String(), tt.in) || a.Proto() != tt.pb {
				t.Fatalf("ParseAccess(%q) = %v (%v), %v", tt.in, a, a.Proto(), err)
			}
			if back, err := wire.AccessFromProto(tt.pb, 0); err != nil || back != a {
				t.Errorf("AccessFromProto(%v) = %v, %v", tt.pb, back, err)
			}
		})
	}
	if _, err := wire.ParseAccess("anyone"); err == nil {
		t.Error("ParseAccess accepted anyone")
	}
	if a, err := wire.AccessFromProto(moehostv1.Access_ACCESS_UNSPECIFIED, wire.AccessOwner); err != nil || a != wire.AccessOwner {
		t.Errorf("ACCESS_UNSPECIFIED = %v, %v; want the default", a, err)
	}
	if wire.Access(0).Proto() != moehostv1.Access_ACCESS_UNSPECIFIED {
		t.Error("the zero Access is not ACCESS_UNSPECIFIED on the wire")
	}
}

// TestDeploymentFromProto checks the conversion of a full request, and
// that each refusal wraps ErrInvalidRequest without saying so in its
// message (the server codes it InvalidArgument, which says it).
func TestDeploymentFromProto(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("ab", 32)
	opt := &moehostv1.OptimizerConfig{Name: "sgd", Lr: 0.5}
	d, err := wire.DeploymentFromProto(&moehostv1.DeployExpertRequest{
		Experts: "a.[0:2]", ModuleDigest: digest, Config: map[string]int64{"hidden_dim": 8}, Optimizer: opt,
		Batching:      &moehostv1.BatchLimits{MaxBatchSize: 4, MaxWait: durationpb.New(time.Millisecond)},
		Limits:        &moehostv1.ExpertLimits{CallTimeout: durationpb.New(time.Second), MemoryPages: 3},
		ForwardAccess: moehostv1.Access_ACCESS_TENANTS,
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.Experts != "a.[0:2]" || d.Module != digest || d.Config["hidden_dim"] != 8 || d.Optimizer != opt ||
		d.Batching != (wire.BatchLimits{MaxBatchSize: 4, MaxWait: time.Millisecond}) ||
		d.Limits != (wire.ExpertLimits{CallTimeout: time.Second, MemoryPages: 3}) ||
		d.Forward != wire.AccessTenants || d.Backward != wire.DefaultBackward {
		t.Errorf("got %+v", d)
	}
	tests := []struct {
		name string
		req  *moehostv1.DeployExpertRequest
		msg  string
	}{
		{"bad digest", &moehostv1.DeployExpertRequest{Experts: "a", ModuleDigest: "sha256:x"}, `module digest "sha256:x" is not`},
		{"no experts", &moehostv1.DeployExpertRequest{ModuleDigest: digest}, "experts (a uid or uid pattern) is empty"},
		{"unknown access", &moehostv1.DeployExpertRequest{Experts: "a", ModuleDigest: digest, BackwardAccess: 9}, "backward_access 9 is not a known access"},
		{"invalid duration", &moehostv1.DeployExpertRequest{Experts: "a", ModuleDigest: digest,
			Limits: &moehostv1.ExpertLimits{CallTimeout: &durationpb.Duration{Seconds: 1, Nanos: -1}}}, "limits call_timeout: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := wire.DeploymentFromProto(tt.req)
			if !errors.Is(err, wire.ErrInvalidRequest) || !strings.HasPrefix(err.Error(), tt.msg) {
				t.Errorf("err = %v, want ErrInvalidRequest starting %q", err, tt.msg)
			}
			if err != nil && strings.Contains(err.Error(), wire.ErrInvalidRequest.Error()) {
				t.Errorf("%q names its sentinel", err)
			}
		})
	}
}
