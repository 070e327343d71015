package dht_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/host/internal/dht"
)

type noExperts struct{}

func (noExperts) DHTExperts() []dht.Expert { return nil }

// TestKeepPort restarts a DHT node on its data dir: with KeepPort it
// comes back on the port of the last start, or on a fresh one with a
// warning when another process took that port; without, on a fresh one,
// and it keeps no port.
func TestKeepPort(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		keep     bool
		take     bool // another process holds the first start's port
		samePort bool // checked with keep only: port 0 may draw the same port twice
		warning  string
	}{
		{name: "kept", keep: true, samePort: true},
		{name: "taken", keep: true, take: true, warning: "the DHT port of the last start is taken"},
		{name: "not kept", keep: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var logged bytes.Buffer
			start := func() *dht.Service {
				t.Helper()
				s, err := dht.New(context.Background(), dht.Config{DataDir: dir, Listen: []string{"/ip4/127.0.0.1/tcp/0"},
					KeepPort: tt.keep, URLs: []string{"http://127.0.0.1:1"}, Logger: slog.New(slog.NewTextHandler(&logged, nil))}, noExperts{})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			first := start()
			addrs := first.Addrs()
			if err := first.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tt.take {
				port := strings.Split(addrs[0], "/")[4]
				l, err := net.Listen("tcp", "127.0.0.1:"+port)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
			}
			second := start()
			defer second.Close(context.Background())
			if got := second.Addrs(); tt.keep && slices.Equal(got, addrs) != tt.samePort {
				t.Errorf("restarted at %v, first at %v; want the same port: %v", got, addrs, tt.samePort)
			}
			if tt.warning == "" && strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), tt.warning) {
				t.Errorf("log %q, want a warning %q", logged.String(), tt.warning)
			}
			b, err := os.ReadFile(filepath.Join(dir, dht.PortFile))
			switch {
			case !tt.keep && !os.IsNotExist(err):
				t.Errorf("%s without KeepPort: %q, %v; want none", dht.PortFile, b, err)
			case tt.keep && (err != nil || "/tcp/"+strings.TrimSpace(string(b))+"/" != "/tcp/"+strings.Split(second.Addrs()[0], "/")[4]+"/"):
				t.Errorf("%s = %q, %v; want the port of %v", dht.PortFile, b, err, second.Addrs())
			}
		})
	}
}
