package certs_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/certs"
	"github.com/moehost/moehost/internal/testing/testca"
)

// fixture is a CA, two server pairs it signed, and the files the
// reloader serves, holding the first pair.
type fixture struct {
	ca         *testca.CA
	one, two   testca.Pair
	cert, key  string
	clientCA   string
	clientPair testca.Pair
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ca, err := testca.New("test CA")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ca: ca}
	if f.one, err = ca.Server("one"); err != nil {
		t.Fatal(err)
	}
	if f.two, err = ca.Server("two"); err != nil {
		t.Fatal(err)
	}
	if f.clientPair, err = ca.Client("alice"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if f.cert, f.key, err = f.one.Write(dir, "server"); err != nil {
		t.Fatal(err)
	}
	f.clientCA = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(f.clientCA, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// put writes p over the served files.
func (f *fixture) put(t *testing.T, p testca.Pair) {
	t.Helper()
	if err := os.WriteFile(f.cert, p.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.key, p.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
}

// serve runs a TLS listener over the reloader's config that answers each
// connection's lines with "ok", and returns its address.
func serve(t *testing.T, r *certs.Reloader) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.TLSConfig())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					if _, err := c.Write([]byte("ok")); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// served dials addr and returns the common name of the certificate it
// shows, or the handshake's error.
func (f *fixture) served(t *testing.T, addr string, client *tls.Certificate) (string, error) {
	t.Helper()
	conf := &tls.Config{RootCAs: f.ca.Pool(), ServerName: "localhost"}
	if client != nil {
		conf.Certificates = []tls.Certificate{*client}
	}
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// A TLS 1.3 server refuses a client certificate after the client's
	// handshake is done: the refusal comes with the first read.
	if err := ping(c); err != nil {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func ping(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 2)
	_, err := c.Read(buf)
	return err
}

// waitServed polls until addr serves the certificate named cn.
func (f *fixture) waitServed(t *testing.T, addr, cn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := f.served(t, addr, nil)
		if err == nil && got == cn {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("served %q (%v), want %q", got, err, cn)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// syncBuffer is a log destination safe for the watch goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, cfg certs.Config) (*certs.Reloader, *syncBuffer) {
	t.Helper()
	logs := new(syncBuffer)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r, err := certs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r, logs
}

// TestReloadOnChange: a new pair written over the files is served to new
// handshakes within a poll, while a connection made before keeps working;
// a bad pair then is logged once and the good one kept.
func TestReloadOnChange(t *testing.T) {
	f := newFixture(t)
	r, logs := start(t, certs.Config{CertFile: f.cert, KeyFile: f.key, PollInterval: 20 * time.Millisecond})
	addr := serve(t, r)
	f.waitServed(t, addr, "one")
	old, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: f.ca.Pool(), ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	f.put(t, f.two)
	f.waitServed(t, addr, "two")
	if got := r.Certificate().Subject.CommonName; got != "two" {
		t.Errorf("Certificate() = %q, want two", got)
	}
	if err := ping(old); err != nil {
		t.Errorf("a connection made before the reload: %v", err)
	}
	if !strings.Contains(logs.String(), "TLS certificate reloaded") {
		t.Errorf("no reload logged:\n%s", logs)
	}

	// Garbage, and a key that is not the certificate's: both kept out.
	for _, tc := range []struct {
		name      string
		cert, key []byte
	}{
		{"garbage", []byte("not a certificate\n"), f.one.KeyPEM},
		{"mismatched key", f.one.CertPEM, f.two.KeyPEM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := strings.Count(logs.String(), "not reloaded")
			if err := os.WriteFile(f.cert, tc.cert, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f.key, tc.key, 0o600); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for strings.Count(logs.String(), "not reloaded") == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			// A poll between the two writes may see a change of its own;
			// after that, polls of unchanged files log nothing more.
			time.Sleep(100 * time.Millisecond)
			n := strings.Count(logs.String(), "not reloaded")
			time.Sleep(200 * time.Millisecond) // ten more polls
			if n == before || strings.Count(logs.String(), "not reloaded") != n {
				t.Errorf("the bad pair was logged %d times, then %d more; want once or twice, then none:\n%s",
					n-before, strings.Count(logs.String(), "not reloaded")-n, logs)
			}
			if got, err := f.served(t, addr, nil); err != nil || got != "two" {
				t.Errorf("after a bad pair: served %q (%v), want the last good one, two", got, err)
			}
			if err := r.Reload(); err == nil {
				t.Error("Reload of a bad pair: no error")
			}
		})
	}
	f.put(t, f.one)
	f.waitServed(t, addr, "one")
}

// TestReloadOnSIGHUP: a SIGHUP reloads files that changed without the
// watch seeing it (the poll is an hour).
func TestReloadOnSIGHUP(t *testing.T) {
	f := newFixture(t)
	r, _ := start(t, certs.Config{CertFile: f.cert, KeyFile: f.key, PollInterval: time.Hour})
	addr := serve(t, r)
	f.waitServed(t, addr, "one")
	f.put(t, f.two)
	if got, _ := f.served(t, addr, nil); got != "one" {
		t.Fatalf("served %q before the SIGHUP, want one", got)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	f.waitServed(t, addr, "two")
}

// TestNewRefusesABadPair: New names the file it could not use.
func TestNewRefusesABadPair(t *testing.T) {
	f := newFixture(t)
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  certs.Config
		want string
	}{
		{"no key", certs.Config{CertFile: f.cert}, "both"},
		{"missing cert", certs.Config{CertFile: bad + ".missing", KeyFile: f.key}, "bad.pem.missing"},
		{"junk cert", certs.Config{CertFile: bad, KeyFile: f.key}, "bad.pem"},
		{"junk client CA", certs.Config{CertFile: f.cert, KeyFile: f.key, ClientCAFile: bad}, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := certs.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestClientCA: with a client CA, a client without a certificate is
// refused and one with a certificate it signed is served.
func TestClientCA(t *testing.T) {
	f := newFixture(t)
	r, _ := start(t, certs.Config{CertFile: f.cert, KeyFile: f.key, ClientCAFile: f.clientCA})
	addr := serve(t, r)
	if _, err := f.served(t, addr, nil); err == nil {
		t.Error("a client without a certificate was served")
	}
	other, err := testca.New("other CA")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Client("mallory")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pair testca.Pair
		ok   bool
	}{
		{"signed by the client CA", f.clientPair, true},
		{"signed by another CA", stranger, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := tls.X509KeyPair(tc.pair.CertPEM, tc.pair.KeyPEM)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.served(t, addr, &cert)
			if tc.ok && (err != nil || got != "one") {
				t.Errorf("served %q (%v), want one", got, err)
			}
			if !tc.ok && err == nil {
				t.Error("served")
			}
		})
	}
}
