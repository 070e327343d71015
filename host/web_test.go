package host

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/internal/testing/grpcreflect"
)

// TestGetServerInfo calls ServerService over each protocol and checks
// every field the server knows today.
func TestGetServerInfo(t *testing.T) {
	base := "http://" + testServer.Addr()
	clients := []struct {
		name string
		opts []connect.ClientOption
	}{
		{"connect", nil},
		{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			cl := moehostv1connect.NewServerServiceClient(http.DefaultClient, base, c.opts...)
			res, err := cl.GetServerInfo(context.Background(), connect.NewRequest(&moehostv1.GetServerInfoRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			got := res.Msg
			if got.GetListenAddress() != testServer.Addr() {
				t.Errorf("listen address %q, want %q", got.GetListenAddress(), testServer.Addr())
			}
			if got.GetExpertCount() != 3 {
				t.Errorf("expert count %d, want 3", got.GetExpertCount())
			}
			if got.GetVersion() == "" || !strings.HasPrefix(got.GetGoVersion(), "go") {
				t.Errorf("version %q, go version %q", got.GetVersion(), got.GetGoVersion())
			}
			if len(got.GetDevices()) != 1 || got.GetDevices()[0].GetName() != "cpu" || got.GetDevices()[0].GetDescription() == "" {
				t.Fatalf("devices %v, want one cpu described", got.GetDevices())
			}
			// The CPU's description gives the cores this process may use
			// and its kernel threads: one fewer than GOMAXPROCS, which the
			// server raised by one for answering requests.
			desc := got.GetDevices()[0].GetDescription()
			cores := fmt.Sprintf("%d core", runtime.NumCPU())
			threads := fmt.Sprintf("kernels on %d thread", runtime.GOMAXPROCS(0)-1)
			if !strings.Contains(desc, cores) || !strings.Contains(desc, threads) || !strings.HasPrefix(desc, runtime.GOOS+"/"+runtime.GOARCH) {
				t.Errorf("cpu description %q, want %s/%s, %q and %q", desc, runtime.GOOS, runtime.GOARCH, cores, threads)
			}
			// The test server's experts hold parameters, so live bytes are
			// positive and within the limit and the recent peak.
			dev, limit := got.GetDevices()[0], got.GetMemoryLimitBytes()
			if want := testServer.MemoryLimit(); limit != want || limit <= 0 {
				t.Errorf("memory limit %d, want the server's %d", limit, want)
			}
			if live := dev.GetLiveTensorBytes(); live <= 0 || live > limit || live > dev.GetPeakTensorBytes() ||
				dev.GetPoolHitRate() < 0 || dev.GetPoolHitRate() > 1 {
				t.Errorf("device memory %v under a limit of %d", dev, limit)
			}
			start := got.GetStartTime().AsTime()
			if age := time.Since(start); got.GetStartTime() == nil || age < 0 || age > time.Hour {
				t.Errorf("start time %v is %v ago", start, age)
			}
			if up := got.GetUptimeSeconds(); up <= 0 || up > time.Since(start).Seconds()+1 {
				t.Errorf("uptime %gs, started %v ago", up, time.Since(start))
			}
			if len(got.GetAnnounceAddresses()) != 0 || len(got.GetPeers()) != 0 || got.GetPeerId() != "" || len(got.GetDhtRecords()) != 0 {
				t.Errorf("announce %v, peers %v, peer id %q, records %v without a DHT node", got.GetAnnounceAddresses(), got.GetPeers(), got.GetPeerId(), got.GetDhtRecords())
			}
		})
	}
}

// TestServerServiceReflected checks that grpcurl and buf curl can find
// ServerService.
func TestServerServiceReflected(t *testing.T) {
	names := grpcreflect.Services(t, testServer.Addr())
	if !slices.Contains(names, "moehost.v1.ServerService") {
		t.Errorf("reflection lists %v, want moehost.v1.ServerService among them", names)
	}
}

// TestCORS sends the preflight and the call a browser on each origin
// would, and checks what the browser would let the page read.
func TestCORS(t *testing.T) {
	srv := startTestServer(t,
		WithExperts(ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)}),
		WithCORSOrigins("http://allowed.test:8080, https://*.dash.test", "http://also.test"),
	)
	plain := startTestServer(t, WithExperts(ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)}))
	const proc = "/moehost.v1.ServerService/GetServerInfo"
	tests := []struct {
		name    string
		addr    string
		origin  string
		allowed bool
	}{
		{"listed", srv.Addr(), "http://allowed.test:8080", true},
		{"second flag", srv.Addr(), "http://also.test", true},
		{"wildcard subdomain", srv.Addr(), "https://a.dash.test", true},
		{"other port", srv.Addr(), "http://allowed.test:8081", false},
		{"other scheme", srv.Addr(), "https://allowed.test:8080", false},
		{"unlisted", srv.Addr(), "http://evil.test", false},
		{"no origins configured", plain.Addr(), "http://allowed.test:8080", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The preflight a browser sends before a Connect POST with a
			// JSON body, a protocol header and a token: header names
			// lowercase and sorted, as browsers send them.
			pre, _ := http.NewRequest(http.MethodOptions, "http://"+tt.addr+proc, nil)
			pre.Header.Set("Origin", tt.origin)
			pre.Header.Set("Access-Control-Request-Method", "POST")
			pre.Header.Set("Access-Control-Request-Headers", "authorization,connect-protocol-version,content-type")
			res, err := http.DefaultClient.Do(pre)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			acao := res.Header.Get("Access-Control-Allow-Origin")
			if tt.allowed {
				if acao != tt.origin {
					t.Errorf("preflight: Access-Control-Allow-Origin %q, want %q", acao, tt.origin)
				}
				hdrs := strings.ToLower(res.Header.Get("Access-Control-Allow-Headers"))
				for _, h := range []string{"connect-protocol-version", "authorization", "content-type"} {
					if !strings.Contains(hdrs, h) {
						t.Errorf("preflight allows headers %q, want %s among them", hdrs, h)
					}
				}
			} else if acao != "" {
				t.Errorf("preflight: Access-Control-Allow-Origin %q, want none", acao)
			}

			req, _ := http.NewRequest(http.MethodPost, "http://"+tt.addr+proc, strings.NewReader("{}"))
			req.Header.Set("Origin", tt.origin)
			req.Header.Set("Content-Type", "application/json")
			res, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "listenAddress") {
				t.Errorf("call: %s %s", res.Status, body)
			}
			acao = res.Header.Get("Access-Control-Allow-Origin")
			if tt.allowed {
				if acao != tt.origin {
					t.Errorf("call: Access-Control-Allow-Origin %q, want %q", acao, tt.origin)
				}
				if exp := strings.ToLower(res.Header.Get("Access-Control-Expose-Headers")); !strings.Contains(exp, "grpc-status") {
					t.Errorf("call exposes %q, want grpc-status among them for gRPC-Web", exp)
				}
			} else if acao != "" {
				t.Errorf("call: Access-Control-Allow-Origin %q, want none", acao)
			}
		})
	}
}

func TestCORSOriginsValidated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		origin string
		err    string // "" when valid
	}{
		{"any", "*", ""},
		{"host and port", "http://127.0.0.1:5173", ""},
		{"https", "https://dash.example.org", ""},
		{"subdomain wildcard", "https://*.example.org", ""},
		{"trailing slash", "https://dash.example.org/", ""},
		{"no scheme", "dash.example.org", `CORS origin "dash.example.org"`},
		{"path", "https://dash.example.org/ui", `CORS origin "https://dash.example.org/ui"`},
		{"ftp", "ftp://dash.example.org", `CORS origin "ftp://dash.example.org"`},
		{"two stars", "https://*.*.example.org", `more than one "*"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(WithCORSOrigins(tt.origin))
			if tt.err == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("New: %v, want an error containing %q", err, tt.err)
			}
		})
	}
}

// TestDashboardServed checks that /ui/ serves the embedded page and its
// assets, and that / points browsers to it.
func TestDashboardServed(t *testing.T) {
	base := "http://" + testServer.Addr()
	res, err := http.Get(base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui/: %s, %s", res.Status, res.Header.Get("Content-Type"))
	}
	if !strings.Contains(string(page), "<title>moehost</title>") {
		t.Errorf("GET /ui/ is not the dashboard:\n%s", page)
	}
	if cc := res.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Errorf("index Cache-Control %q, want no-cache", cc)
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err = noRedirect.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /: %s to %q, want a redirect to /ui/", res.Status, res.Header.Get("Location"))
	}

	res, err = http.Post(base+"/ui/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %s, want 405", res.Status)
	}
}
