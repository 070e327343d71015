package ui

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAuthedPaths: /ui/api/experts and /ui/api/tenants hand the request's
// headers to the server's function and serve what it returns as JSON, or
// a 401 with its error's words; without a function their paths are not
// found, rather than the page.
func TestAuthedPaths(t *testing.T) {
	const token = "s3cret"
	refuse := errors.New("the bearer token is not valid on this server")
	authed := func(h http.Header) bool { return h.Get("Authorization") == "Bearer "+token }
	api := API{
		Experts: func(h http.Header) (Experts, error) {
			if h.Get("Authorization") != "" && !authed(h) {
				return Experts{}, refuse
			}
			return Experts{RateWindowMs: 10000, Experts: []Expert{{UID: "ffn.0", RowsPerSecond: 12.5, Checkpoint: &Checkpoint{Step: 3, UnixMs: 1000}}, {UID: "ffn.1"}}}, nil
		},
		Tenants: func(h http.Header) (Tenants, error) {
			if !authed(h) {
				return Tenants{}, refuse
			}
			return Tenants{Tenants: []Tenant{{Name: "alice", Prefixes: []string{"alice"}, Tokens: 1, Modules: 1, Experts: []string{"alice.ffn.0"}}},
				Modules: []Module{{Owner: "alice", Digest: "sha256:ab", Experts: []string{"alice.ffn.0"}}}}, nil
		},
	}
	srv := httptest.NewServer(Handler(api))
	defer srv.Close()
	get := func(path, auth string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}

	res, body := get("/ui/api/experts", "")
	var ex Experts
	if err := json.Unmarshal([]byte(body), &ex); err != nil || res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("experts: %s %v %q", res.Status, err, body)
	}
	if ex.RateWindowMs != 10000 || len(ex.Experts) != 2 || ex.Experts[0].RowsPerSecond != 12.5 || ex.Experts[0].Checkpoint.Step != 3 || ex.Experts[1].Checkpoint != nil {
		t.Errorf("experts %+v", ex)
	}
	if !strings.Contains(body, `"checkpoint":null`) {
		t.Errorf("an expert without a checkpoint: %s", body)
	}
	if res, body := get("/ui/api/experts", "Bearer wrong"); res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, refuse.Error()) || res.Header.Get("WWW-Authenticate") != "Bearer" {
		t.Errorf("experts with a bad token: %s %q", res.Status, body)
	}

	if res, body := get("/ui/api/tenants", ""); res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, refuse.Error()) {
		t.Errorf("tenants without a token: %s %q", res.Status, body)
	}
	res, body = get("/ui/api/tenants", "Bearer "+token)
	var tv Tenants
	if err := json.Unmarshal([]byte(body), &tv); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("tenants: %s %v %q", res.Status, err, body)
	}
	if len(tv.Tenants) != 1 || tv.Tenants[0].Name != "alice" || len(tv.Modules) != 1 || tv.Modules[0].Owner != "alice" {
		t.Errorf("tenants %+v", tv)
	}

	// Without the functions (a server without tenants has no Tenants):
	// not found.
	bare := httptest.NewServer(Handler(API{}))
	defer bare.Close()
	for _, p := range []string{"/ui/api/experts", "/ui/api/tenants"} {
		res, err := http.Get(bare.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("%s without its function: %s", p, res.Status)
		}
	}
}
