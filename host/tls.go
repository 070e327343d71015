package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"

	"github.com/moehost/moehost/host/internal/certs"
)

// TLSConfig names the PEM files of the port's certificate.
type TLSConfig struct {
	// CertFile is the server's certificate, followed by any intermediate
	// certificates; KeyFile its private key. Both are required.
	CertFile, KeyFile string
	// ClientCAFile, when set, holds the certificates of the CAs that sign
	// client certificates: every client must then show one signed by
	// them (mutual TLS). Default none: clients show no certificate.
	ClientCAFile string
}

// WithTLS serves the port over TLS with the certificate in the given
// files: Connect, gRPC and gRPC-Web on one port, HTTP/2 chosen by ALPN
// and HTTP/1.1 for the clients that ask for it (gRPC-Web and Connect from
// browsers and curl). The server rereads the files on SIGHUP and when
// they change (their size, modification time or inode, looked at every
// two seconds); a connection keeps the certificate it was made with, and
// a new set that does not load is logged and the old one kept. With a
// DHT, the default announced URL is then "https://" plus the bound
// address. Default none: plaintext HTTP/1.1 and HTTP/2 (h2c), for
// loopback and private networks.
func WithTLS(c TLSConfig) Option {
	return optionFunc(func(cfg *config) {
		if c == (TLSConfig{}) {
			cfg.tls = nil
			return
		}
		cfg.tls = &c
	})
}

// validateTLS checks the TLS settings in New; Start loads the files.
func (c *config) validateTLS() error {
	if c.tls == nil {
		return nil
	}
	if c.tls.CertFile == "" || c.tls.KeyFile == "" {
		return errors.New("moehost: TLS needs both a certificate and a key file (--tls-cert, --tls-key)")
	}
	return nil
}

// scheme is the scheme of the port's URLs.
func (c *config) scheme() string {
	if c.tls != nil {
		return "https"
	}
	return "http"
}

// openCerts loads the certificate files, before anything else starts,
// so that a bad file fails the start at once.
func (s *Server) openCerts() error {
	if s.cfg.tls == nil {
		return nil
	}
	r, err := certs.New(certs.Config{
		CertFile: s.cfg.tls.CertFile, KeyFile: s.cfg.tls.KeyFile, ClientCAFile: s.cfg.tls.ClientCAFile,
		NextProtos: []string{"h2", "http/1.1"},
		Logger:     s.log,
	})
	if err != nil {
		return fmt.Errorf("moehost: %w", err)
	}
	s.mu.Lock()
	s.certs = r
	s.mu.Unlock()
	return nil
}

// serveTLS sets srv up for TLS when the server has a certificate, and
// starts watching its files; it reports whether it did.
func (s *Server) serveTLS(srv *http.Server) bool {
	s.mu.Lock()
	r := s.certs
	s.mu.Unlock()
	if r == nil {
		return false
	}
	srv.TLSConfig = r.TLSConfig()
	srv.Protocols.SetHTTP2(true)
	srv.Protocols.SetUnencryptedHTTP2(false)
	_ = r.Start(context.Background()) // fails only when started twice
	return true
}

// closeCerts stops watching the certificate files.
func (s *Server) closeCerts(ctx context.Context) error {
	s.mu.Lock()
	r := s.certs
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.Close(ctx)
}

// httpErrorLog is net/http's error log: warnings, but for failed TLS
// handshakes, which anyone can cause (a scanner, a plaintext client,
// garbage) and which are logged at debug.
func httpErrorLog(l *slog.Logger) *log.Logger {
	return log.New(handshakeFilter{l}, "", 0)
}

type handshakeFilter struct{ log *slog.Logger }

func (f handshakeFilter) Write(p []byte) (int, error) {
	msg := string(bytes.TrimSuffix(p, []byte("\n")))
	level := slog.LevelWarn
	if bytes.HasPrefix(p, []byte("http: TLS handshake error")) {
		level = slog.LevelDebug
	}
	f.log.Log(context.Background(), level, msg)
	return len(p), nil
}
