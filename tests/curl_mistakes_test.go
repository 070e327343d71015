package tests

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestCurlMistakesGetAnAnswer sends `moehost serve` what curl sends when
// its user forgets -H 'Content-Type: application/json' (a form
// encoding), or sends text/plain, or a GET: each answer's body says what
// to send, where it was empty (and `curl -s` printed nothing). The
// CheckpointService answers alike.
func TestCurlMistakesGetAnAnswer(t *testing.T) {
	t.Parallel()
	s := serve(t)
	for _, tt := range []struct{ name, method, path, contentType string }{
		{"form encoded", http.MethodPost, "/moehost.v1.ExpertService/Info", "application/x-www-form-urlencoded"},
		{"text/plain", http.MethodPost, "/moehost.v1.ExpertService/Info", "text/plain"},
		{"GET", http.MethodGet, "/moehost.v1.ExpertService/Forward", ""},
		{"checkpoints, form encoded", http.MethodPost, "/moehost.v1.CheckpointService/List", "application/x-www-form-urlencoded"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, s.url+tt.path, strings.NewReader(`{"uid":"nop.0"}`))
			if err != nil {
				t.Fatal(err)
			}
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusUnsupportedMediaType && res.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("status %d, want 415 or 405: %s", res.StatusCode, body)
			}
			for _, want := range []string{"Content-Type: application/json", "application/proto", "application/grpc", "curl -H 'Content-Type: application/json'"} {
				if !strings.Contains(string(body), want) {
					t.Errorf("body %q lacks %q", body, want)
				}
			}
		})
	}
}
