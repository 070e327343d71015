// Package testca makes a certificate authority at test time: a CA, a
// server certificate for 127.0.0.1, ::1 and localhost signed by it, and a
// client certificate for mutual TLS. Keys are ECDSA P-256, the
// certificates valid for a day. Nothing here is fit for production.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that signs leaves for tests.
type CA struct {
	// PEM is the CA certificate, PEM-encoded: what a client trusts.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Pair is a leaf certificate and its key, PEM-encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
	// SPKI is the base64 SHA-256 of the certificate's public key info,
	// as Chromium's --ignore-certificate-errors-spki-list takes it.
	SPKI string
}

// New makes a CA named cn.
func New(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// Pool is a pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server signs a server certificate named cn for 127.0.0.1, ::1 and
// localhost.
func (ca *CA) Server(cn string) (Pair, error) {
	return ca.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// Client signs a client certificate named cn.
func (ca *CA) Client(cn string) (Pair, error) {
	return ca.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (ca *CA) leaf(tmpl *x509.Certificate) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Pair{}, err
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		SPKI:    base64.StdEncoding.EncodeToString(sum[:]),
	}, nil
}

// Write writes the pair to dir as name.pem and name-key.pem (the key
// readable by its owner alone), and returns their paths.
func (p Pair) Write(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, p.CertPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, p.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// Files are the paths WriteAll writes.
type Files struct {
	CA, Cert, Key, ClientCert, ClientKey string
	// SPKI is the server certificate's SPKI hash (Pair.SPKI).
	SPKI string
}

// WriteAll makes a CA, a server pair and a client pair, and writes them
// to dir: ca.pem, server.pem, server-key.pem, client.pem, client-key.pem,
// and server.spki with the server certificate's SPKI hash.
func WriteAll(dir string) (Files, error) {
	ca, err := New("moehost test CA")
	if err != nil {
		return Files{}, err
	}
	srv, err := ca.Server("moehost test server")
	if err != nil {
		return Files{}, err
	}
	cl, err := ca.Client("moehost test client")
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.pem"), SPKI: srv.SPKI}
	if err := os.WriteFile(f.CA, ca.PEM, 0o644); err != nil {
		return Files{}, err
	}
	if f.Cert, f.Key, err = srv.Write(dir, "server"); err != nil {
		return Files{}, err
	}
	if f.ClientCert, f.ClientKey, err = cl.Write(dir, "client"); err != nil {
		return Files{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "server.spki"), []byte(srv.SPKI+"\n"), 0o644); err != nil {
		return Files{}, err
	}
	return f, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("BUG: crypto/rand: %v", err))
	}
	return n
}

// LoadPool reads a PEM CA file into a pool.
func LoadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return p, nil
}
