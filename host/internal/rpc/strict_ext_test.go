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
// that each answer says what is wrong: no Content-Type is 415 naming
// what to send; a misspelt field is invalid_argument naming the field.
func TestJSONRequestMistakes(t *testing.T) {
	url := server(t, noExperts{}, rpc.Options{})
	for _, tt := range []struct {
		name, contentType, body string
		wantStatus              int
		want                    []string
	}{
		{"no content type", "", `{"uid":"ffn.0"}`, http.StatusUnsupportedMediaType, []string{"Content-Type: application/json", "application/grpc"}},
		{"unknown field", "application/json", `{"uuid":"ffn.0"}`, http.StatusBadRequest, []string{"invalid_argument", `unknown field \"uuid\"`}},
		{"unknown field, charset", "application/json; charset=utf-8", `{"uid":"ffn.0","extra":1}`, http.StatusBadRequest, []string{`unknown field \"extra\"`}},
		{"known field", "application/json", `{"uid":"ffn.0"}`, http.StatusNotFound, []string{"not_found"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, url+moehostv1connect.ExpertServiceInfoProcedure, strings.NewReader(tt.body))
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
