package host_test

import (
	"bufio"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// scrape GETs addr's /metrics, as Prometheus does, and returns its
// samples by series, each written as name{label="value",...} with the
// labels sorted (as the text format writes them).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("/metrics: %s: %s", res.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cut := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[cut+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:cut]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// series writes name and labels (name, value pairs) as scrape keys them.
func series(name string, labels ...string) string {
	type kv struct{ k, v string }
	var kvs []kv
	for i := 0; i+1 < len(labels); i += 2 {
		kvs = append(kvs, kv{labels[i], labels[i+1]})
	}
	slices.SortFunc(kvs, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	var parts []string
	for _, p := range kvs {
		parts = append(parts, p.k+`="`+p.v+`"`)
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

// TestMetricsCountRPCs calls a real server over Connect and gRPC-Web and
// checks that /metrics counts each call by service, method and code, a
// refusal by the rooms (an unknown expert) and one at the door (no token)
// included, and times them; and that it says which build serves.
func TestMetricsCountRPCs(t *testing.T) {
	const h = 8
	ctx := context.Background()
	srv, err := ckptServer(t, t.TempDir(), wasmexperts.FFN, h, host.CheckpointConfig{}, host.WithAdminToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	c := client.New(srv.Addr())
	defer c.Close()
	forward(t, c, h)
	forward(t, c, h)
	x := client.Float32([]int64{1, h}, make([]float32, h))
	if _, err := c.Expert("nope.0").Forward(ctx, x); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Forward of an unknown expert: %v, want NotFound", err)
	}
	cc := moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+srv.Addr(), connect.WithGRPCWeb())
	if _, err := cc.List(ctx, connect.NewRequest(&moehostv1.CheckpointServiceListRequest{Uid: "ffn.0"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("List with no token: %v, want Unauthenticated", err)
	}

	got := scrape(t, srv.Addr())
	const es, cs = "moehost.v1.ExpertService", "moehost.v1.CheckpointService"
	for _, tt := range []struct {
		name   string
		series string
		want   float64
	}{
		{"forwards that answered", series("moehost_rpc_requests_total", "service", es, "method", "Forward", "code", "ok"), 2},
		{"a forward to an unknown expert", series("moehost_rpc_requests_total", "service", es, "method", "Forward", "code", "not_found"), 1},
		{"a call refused for its missing token", series("moehost_rpc_requests_total", "service", cs, "method", "List", "code", "unauthenticated"), 1},
		{"forwards timed", series("moehost_rpc_duration_seconds_count", "service", es, "method", "Forward"), 3},
		{"refused calls timed", series("moehost_rpc_duration_seconds_count", "service", cs, "method", "List"), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if v, ok := got[tt.series]; !ok || v != tt.want {
				t.Errorf("%s = %v (present %v), want %v", tt.series, v, ok, tt.want)
			}
		})
	}
	build := series("moehost_build_info", "version", host.Version(), "commit", host.Commit(), "go_version", runtime.Version())
	if v, ok := got[build]; !ok || v != 1 {
		t.Errorf("%s = %v (present %v), want 1", build, v, ok)
	}
	for k := range got {
		if strings.HasPrefix(k, "moehost_rpc_requests_total{") && strings.Contains(k, `code="ok"`) && strings.Contains(k, `service="`+cs+`"`) {
			t.Errorf("%s: a refused call counted as ok", k)
		}
	}
}

// TestMetricsCountCheckpointSaves saves over the CheckpointService and
// checks the save's count and time in /metrics, and that an undeploy
// forgets them.
func TestMetricsCountCheckpointSaves(t *testing.T) {
	const h = 8
	ctx := context.Background()
	srv, err := ckptServer(t, t.TempDir(), wasmexperts.FFN, h, host.CheckpointConfig{}, host.WithAdminToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	c := client.New(srv.Addr())
	defer c.Close()
	train(t, c, h, 1, rand.New(rand.NewPCG(1, 2)))
	okSaves := series("moehost_checkpoint_saves_total", "expert", "ffn.0", "result", "ok")
	last := series("moehost_checkpoint_last_save_timestamp_seconds", "expert", "ffn.0")
	if got := scrape(t, srv.Addr()); got[okSaves] != 0 || got[last] != 0 {
		t.Fatalf("before any save: %s = %v, %s = %v", okSaves, got[okSaves], last, got[last])
	}
	cc := moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+srv.Addr())
	before := time.Now()
	for range 2 {
		req := connect.NewRequest(&moehostv1.CheckpointServiceSaveRequest{Uid: "ffn.0"})
		req.Header().Set("Authorization", "Bearer s3cret")
		if _, err := cc.Save(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now()
	got := scrape(t, srv.Addr())
	if v := got[okSaves]; v != 2 {
		t.Errorf("%s = %v, want 2", okSaves, v)
	}
	if v, ok := got[series("moehost_checkpoint_saves_total", "expert", "ffn.0", "result", "error")]; ok && v != 0 {
		t.Errorf("%v failed saves counted, want none", v)
	}
	// The text format writes the time to the millisecond or finer.
	if v := got[last]; v < float64(before.Unix()) || v > float64(after.UnixNano())/1e9+1e-3 {
		t.Errorf("%s = %v, want between %v and %v", last, v, float64(before.UnixNano())/1e9, float64(after.UnixNano())/1e9)
	}
	if err := srv.Undeploy(ctx, "ffn.0"); err != nil {
		t.Fatal(err)
	}
	for k := range scrape(t, srv.Addr()) {
		if strings.HasPrefix(k, "moehost_checkpoint_") {
			t.Errorf("%s is left after its expert was undeployed", k)
		}
	}
}

// TestMetricsExpertHealth checks moehost_expert_healthy: 1 for an expert
// that serves, 0 for one whose batches failed UnhealthyAfter times in a
// row, and 1 again after it succeeds.
func TestMetricsExpertHealth(t *testing.T) {
	ctx := context.Background()
	trap := host.ModuleBytes(host.TrapWasm())
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithExperts(host.ExpertConfig{UID: "trap.0", Module: trap}, host.ExpertConfig{UID: "trap.1", Module: trap}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	c := client.New(srv.Addr())
	defer c.Close()
	in := func(first float32) client.Tensor { return client.Float32([]int64{1, 4}, []float32{first, 0, 0, 0}) }
	health := func(uid string) float64 {
		t.Helper()
		s := series("moehost_expert_healthy", "expert", uid)
		v, ok := scrape(t, srv.Addr())[s]
		if !ok {
			t.Fatalf("%s is missing", s)
		}
		return v
	}
	for _, uid := range []string{"trap.0", "trap.1"} {
		if v := health(uid); v != 1 {
			t.Errorf("%s healthy = %v before any call, want 1", uid, v)
		}
	}
	for range 3 { // experts.UnhealthyAfter
		if _, err := c.Expert("trap.0").Forward(ctx, in(-1)); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("trap: %v, want FailedPrecondition", err)
		}
	}
	if v := health("trap.0"); v != 0 {
		t.Errorf("trap.0 healthy = %v after 3 traps in a row, want 0", v)
	}
	if v := health("trap.1"); v != 1 {
		t.Errorf("trap.1 healthy = %v while only trap.0 failed, want 1", v)
	}
	if _, err := c.Expert("trap.0").Forward(ctx, in(1)); err != nil {
		t.Fatal(err)
	}
	if v := health("trap.0"); v != 1 {
		t.Errorf("trap.0 healthy = %v after a success, want 1", v)
	}
}

// TestMetricsCountRefusalsAtTheDoor checks moehost_http_refused_total,
// which counts what the services never see: a POST with no Content-Type
// or another content type (415), a PUT (405), and a body that stalls
// until its idle deadline cuts it.
func TestMetricsCountRefusalsAtTheDoor(t *testing.T) {
	ctx := context.Background()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithBodyTimeouts(200*time.Millisecond, 5*time.Second),
		host.WithExperts(host.ExpertConfig{UID: "trap.0", Module: host.ModuleBytes(host.TrapWasm())}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	url := "http://" + srv.Addr() + moehostv1connect.ExpertServiceInfoProcedure
	post := func(contentType string) int {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"uid":"trap.0"}`))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for _, ct := range []string{"", "text/plain"} {
		if code := post(ct); code != http.StatusUnsupportedMediaType {
			t.Fatalf("POST with Content-Type %q: %d, want 415", ct, code)
		}
	}
	if code := post("application/json"); code != http.StatusOK {
		t.Fatalf("a good POST: %d, want 200", code)
	}
	put, err := http.NewRequest(http.MethodPut, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(put)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("PUT: %d, want 405", res.StatusCode)
	}
	// A body that sends nothing after its first bytes is cut at its idle
	// deadline.
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequest(http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	go pw.Write([]byte(`{"uid":`))
	if res, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}

	got := scrape(t, srv.Addr())
	for _, tt := range []struct {
		reason string
		want   float64
	}{
		{"content_type", 2},
		{"method", 1},
		{"body_idle", 1},
		{"body_timeout", 0},
	} {
		s := series("moehost_http_refused_total", "reason", tt.reason)
		if v, ok := got[s]; !ok || v != tt.want {
			t.Errorf("%s = %v (present %v), want %v", s, v, ok, tt.want)
		}
	}
}
