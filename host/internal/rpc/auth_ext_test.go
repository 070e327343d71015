package rpc_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
)

func TestBearerToken(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, header, token string
		present, bad        bool
	}{
		{"absent", "", "", false, false},
		{"canonical", "Bearer abc", "abc", true, false},
		{"lower-case scheme", "bearer abc", "abc", true, false},
		{"upper-case scheme", "BEARER abc", "abc", true, false},
		{"extra spaces", "Bearer   abc  ", "abc", true, false},
		{"basic", "Basic abc", "", true, true},
		{"no token", "Bearer ", "", true, true},
		{"no space", "Bearerabc", "", true, true},
		{"two tokens", "Bearer abc def", "", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			if tt.header != "" {
				h.Set("Authorization", tt.header)
			}
			token, present, err := rpc.BearerToken(h)
			if token != tt.token || present != tt.present || (err != nil) != tt.bad {
				t.Errorf("got %q, %v, %v; want %q, %v, error %v", token, present, err, tt.token, tt.present, tt.bad)
			}
			if err != nil && connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("code %v, want unauthenticated", connect.CodeOf(err))
			}
		})
	}
}

// callerCheckpoints answers List with the caller it saw as the uid.
type callerCheckpoints struct{}

func (callerCheckpoints) Save(context.Context, string) (*moehostv1.CheckpointInfo, error) {
	return nil, nil
}
func (callerCheckpoints) Restore(context.Context, string, *int64) (*moehostv1.CheckpointInfo, error) {
	return nil, nil
}
func (callerCheckpoints) Parameters(context.Context, string) (int64, []*moehostv1.NamedTensor, error) {
	return 0, nil, nil
}
func (callerCheckpoints) List(ctx context.Context, _ string) ([]*moehostv1.CheckpointInfo, error) {
	c := rpc.CallerFrom(ctx)
	who := c.Tenant
	if c.Operator {
		who = "operator"
	}
	return []*moehostv1.CheckpointInfo{{Uid: who}}, nil
}

// TestCheckpointGate checks who the CheckpointService admits, and as
// whom, with tenants' tokens and without, from loopback.
func TestCheckpointGate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		auth     rpc.Authenticator
		loopback bool
		header   string
		want     string // the caller, or the code
	}{
		{"loopback, no tenants or admin token", nil, true, "", "operator"},
		{"tenants: loopback is not enough", fakeAuth{}, false, "", "unauthenticated"},
		{"tenants: a tenant", fakeAuth{}, false, "Bearer " + aliceToken, "alice"},
		{"tenants: the scheme in lower case", fakeAuth{}, false, "bearer " + bobToken, "bob"},
		{"tenants: the admin token", fakeAuth{}, false, "Bearer " + operatorToken, "operator"},
		{"tenants: a bad token", fakeAuth{}, false, "Bearer nope", "unauthenticated"},
		{"tenants: basic auth", fakeAuth{}, false, "Basic " + aliceToken, "unauthenticated"},
		{"loopback: a bad token is not anonymous", nil, true, "Bearer nope", "unauthenticated"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mux := http.NewServeMux()
			mux.Handle(rpc.NewCheckpointHandler(callerCheckpoints{}, tt.auth, tt.loopback, nil, nil))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			client := moehostv1connect.NewCheckpointServiceClient(srv.Client(), srv.URL)
			req := connect.NewRequest(&moehostv1.CheckpointServiceListRequest{Uid: "x"})
			if tt.header != "" {
				req.Header().Set("Authorization", tt.header)
			}
			res, err := client.List(context.Background(), req)
			got := ""
			if err != nil {
				got = connect.CodeOf(err).String()
			} else {
				got = res.Msg.GetCheckpoints()[0].GetUid()
			}
			if got != tt.want {
				t.Errorf("got %s (%v), want %s", got, err, tt.want)
			}
		})
	}
}
