package dht_test

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/internal/testing/gzipbomb"
)

// TestDiscoveryGzipBomb sends DiscoveryService 960 MiB of zeros in about
// 1 MiB of gzip: it is refused with resource_exhausted after inflating
// about the server's 1 MiB cap on small requests, where a handler without
// the cap inflated the whole message into memory first.
func TestDiscoveryGzipBomb(t *testing.T) {
	srv := startServer(t, t.TempDir(), host.DHTConfig{}, "x.0")
	bomb := gzipbomb.Zeros(960)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	req, _ := http.NewRequest(http.MethodPost, "http://"+srv.Addr()+moehostv1connect.DiscoveryServiceFindExpertsProcedure, bytes.NewReader(bomb))
	req.Header.Set("Content-Type", "application/proto")
	req.Header.Set("Content-Encoding", "gzip")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	runtime.ReadMemStats(&after)
	if !strings.Contains(string(body), "resource_exhausted") {
		t.Errorf("answer %d %q, want resource_exhausted", res.StatusCode, body)
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("the server allocated %d MiB refusing the bomb", allocated>>20)
	if allocated > 64<<20 {
		t.Errorf("refusing a %d-byte gzip bomb allocated %d MiB: it was inflated past the cap", len(bomb), allocated>>20)
	}
}
