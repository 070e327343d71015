// Package certs serves the port's TLS certificate from PEM files and
// swaps in a new one, without a restart and without touching open
// connections, on SIGHUP or when the files change. A new set that does
// not load is logged and the last good one is kept.
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultPollInterval is how often Start looks at the files' size and
// modification time.
const DefaultPollInterval = 2 * time.Second

// Config names the files.
type Config struct {
	// CertFile and KeyFile are the server's certificate (with its chain
	// after it) and private key, PEM-encoded. Both are required.
	CertFile, KeyFile string
	// ClientCAFile, when set, holds the PEM certificates of the CAs whose
	// client certificates the server accepts, and every client must show
	// one (mutual TLS). Default none: no client certificate is asked for.
	ClientCAFile string
	// NextProtos are the ALPN protocols offered, most preferred first,
	// e.g. "h2" and "http/1.1".
	NextProtos []string
	// PollInterval is how often Start stats the files. Default
	// DefaultPollInterval.
	PollInterval time.Duration
	// Logger gets a line per reload. Default none.
	Logger *slog.Logger
}

// Reloader holds the current certificate. Its zero value is not usable;
// make one with New.
type Reloader struct {
	cfg Config
	log *slog.Logger
	// mu serializes reloads (Reload and the watch loop); cur is read
	// without it on every handshake.
	mu    sync.Mutex
	cur   atomic.Pointer[tls.Config]
	tried stamps // the files as the last reload found them, good or bad

	stop, done chan struct{}
	stopOnce   sync.Once
	started    bool // under mu
}

// New loads the files once and returns a Reloader serving them, or the
// error that names the file that did not load.
func New(cfg Config) (*Reloader, error) {
	if cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("a TLS certificate needs both its certificate and its key file")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	r := &Reloader{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	st := r.stat()
	conf, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(conf)
	r.tried = st
	return r, nil
}

// TLSConfig returns the config for the server: each handshake gets the
// current certificate and client CAs. A connection keeps the certificate
// it was made with.
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: r.cfg.NextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load(), nil
		},
	}
}

// Certificate returns the leaf being served now.
func (r *Reloader) Certificate() *x509.Certificate {
	return r.cur.Load().Certificates[0].Leaf
}

// Reload rereads the files. On an error the current certificate stays.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reload(r.stat())
}

func (r *Reloader) reload(st stamps) error {
	r.tried = st
	conf, err := r.load()
	if err != nil {
		return err
	}
	r.cur.Store(conf)
	return nil
}

// load reads the files into a config for one handshake.
func (r *Reloader) load() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", r.cfg.CertFile, r.cfg.KeyFile, err)
	}
	if pair.Leaf == nil { // LoadX509KeyPair fills it since Go 1.23
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("TLS certificate %s: %w", r.cfg.CertFile, err)
		}
	}
	if now := time.Now(); now.After(pair.Leaf.NotAfter) {
		return nil, fmt.Errorf("TLS certificate %s expired at %s", r.cfg.CertFile, pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	conf := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   r.cfg.NextProtos,
		Certificates: []tls.Certificate{pair},
	}
	if r.cfg.ClientCAFile != "" {
		b, err := os.ReadFile(r.cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("TLS client CA file %s: no PEM certificate in it", r.cfg.ClientCAFile)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// Start watches for SIGHUP and for changes to the files (their size,
// modification time or inode, every PollInterval) and reloads on either,
// logging the outcome. Changed files are tried once per change, so that a
// bad pair is logged once, and tried again when it changes again (the
// second of two files written one after the other).
func (r *Reloader) Start(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("certs: already started")
	}
	r.started = true
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer close(r.done)
		defer signal.Stop(hup)
		tick := time.NewTicker(r.cfg.PollInterval)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-hup:
				r.watchReload("SIGHUP", true)
			case <-tick.C:
				r.watchReload("files changed", false)
			}
		}
	}()
	return nil
}

// watchReload reloads, always or when the files changed since the last
// try, and logs what came of it.
func (r *Reloader) watchReload(why string, always bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stat()
	if !always && st.same(r.tried) {
		return
	}
	if err := r.reload(st); err != nil {
		r.log.Error("TLS certificate not reloaded; keeping the previous one", "why", why, "err", err)
		return
	}
	leaf := r.cur.Load().Certificates[0].Leaf
	r.log.Info("TLS certificate reloaded", "why", why, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
}

// Close stops the watch. The certificate stays in use.
func (r *Reloader) Close(ctx context.Context) error {
	r.mu.Lock()
	started := r.started
	r.mu.Unlock()
	if !started {
		return nil
	}
	r.stopOnce.Do(func() { close(r.stop) })
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stamps are the files as a stat sees them.
type stamps [3]os.FileInfo

func (r *Reloader) stat() stamps {
	var st stamps
	for i, p := range []string{r.cfg.CertFile, r.cfg.KeyFile, r.cfg.ClientCAFile} {
		if p != "" {
			st[i], _ = os.Stat(p) // a missing file is a change too
		}
	}
	return st
}

func (a stamps) same(b stamps) bool {
	for i := range a {
		x, y := a[i], b[i]
		if (x == nil) != (y == nil) {
			return false
		}
		if x != nil && (x.Size() != y.Size() || !x.ModTime().Equal(y.ModTime()) || !os.SameFile(x, y)) {
			return false
		}
	}
	return true
}
