package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// caFileEnv is the environment variable --ca-file defaults to.
const caFileEnv = "MOEHOST_CA_FILE"

// caFlag is --ca-file, for the commands that call a server.
type caFlag struct{ file string }

func (c *caFlag) register(f *pflag.FlagSet) {
	f.StringVar(&c.file, "ca-file", "", "PEM file of the CA that signed an https:// server's certificate, trusted beside the system's roots (default $"+caFileEnv+")")
}

// config returns the TLS config for https:// URLs: nil (the system's
// roots) without --ca-file and $MOEHOST_CA_FILE.
func (c *caFlag) config(f *pflag.FlagSet) (*tls.Config, error) {
	file, flag := c.file, "--ca-file"
	if !f.Changed("ca-file") {
		file, flag = os.Getenv(caFileEnv), "$"+caFileEnv
	}
	if file == "" {
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flag, file)
	}
	return &tls.Config{RootCAs: pool}, nil
}

// serverURL returns a --server value with a scheme: http:// when it has
// none.
func serverURL(s string) string {
	if !strings.Contains(s, "://") {
		return "http://" + s
	}
	return s
}

// httpClient speaks HTTP/2 only: over TLS (with conf) for https URLs and
// in cleartext for http ones, so that an upload streams, and stops as
// soon as the server refuses it, whatever the URL.
func httpClient(conf *tls.Config) *http.Client {
	p := new(http.Protocols)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p, Proxy: http.ProxyFromEnvironment, TLSClientConfig: conf}}
}

// unknownCAHint says how to trust a server whose certificate err says no
// known CA signed.
func unknownCAHint(err error) string {
	if !errors.As(err, new(x509.UnknownAuthorityError)) {
		return ""
	}
	return "the server's certificate is signed by a CA this machine does not trust: give the CA's certificate with --ca-file FILE or $" + caFileEnv
}
