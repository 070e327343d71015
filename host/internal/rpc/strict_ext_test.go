package rpc_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/rpc"
)

// TestJSONRequestMistakes posts what a curl user gets wrong and checks
// that each answer says what is wrong: no Content-Type, a form encoding
// (curl -d without -H), text/plain and a GET are 415 or 405 naming what
// to send; a misspelt field is invalid_argument naming the field.
func TestJSONRequestMistakes(t *testing.T) {
	url := server(t, noExperts{}, rpc.Options{})
	for _, tt := range []struct {
		name, method, contentType, body string
		wantStatus                      int
		want                            []string
	}{
		{"no content type", "POST", "", `{"uid":"ffn.0"}`, http.StatusUnsupportedMediaType, []string{"Content-Type: application/json", "application/grpc", "curl -H"}},
		// curl -d without -H sends this.
		{"form encoded", "POST", "application/x-www-form-urlencoded", `{"uid":"ffn.0"}`, http.StatusUnsupportedMediaType, []string{"Content-Type: application/json", "application/grpc", "curl -H"}},
		{"text/plain", "POST", "text/plain", `{"uid":"ffn.0"}`, http.StatusUnsupportedMediaType, []string{"Content-Type: application/json", "application/proto"}},
		// A GET without Connect's ?message= is 415 too (connect's choice).
		{"GET", "GET", "", "", http.StatusUnsupportedMediaType, []string{"POST", "Content-Type: application/json"}},
		{"unknown field", "POST", "application/json", `{"uuid":"ffn.0"}`, http.StatusBadRequest, []string{"invalid_argument", `unknown field \"uuid\"`}},
		{"unknown field, charset", "POST", "application/json; charset=utf-8", `{"uid":"ffn.0","extra":1}`, http.StatusBadRequest, []string{`unknown field \"extra\"`}},
		{"known field", "POST", "application/json", `{"uid":"ffn.0"}`, http.StatusNotFound, []string{"not_found"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, url+moehostv1connect.ExpertServiceInfoProcedure, strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d: %s", res.StatusCode, tt.wantStatus, body)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(body), w) {
					t.Errorf("body %s lacks %q", body, w)
				}
			}
		})
	}
}
