package tests

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moehost/moehost/internal/testing/testca"
)

// testCA writes a CA made now, with a server and a client pair, to a
// temp dir.
func testCA(t *testing.T) testca.Files {
	t.Helper()
	f, err := testca.WriteAll(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// serveTLS is serve with the CA's server pair (and extra args).
func serveTLS(t *testing.T, f testca.Files, args ...string) *served {
	t.Helper()
	s := serve(t, append([]string{"--tls-cert", f.Cert, "--tls-key", f.Key}, args...)...)
	if !strings.HasPrefix(s.url, "https://") {
		t.Fatalf("serve with --tls-cert does not say tls=true:\n%s", s.logText())
	}
	return s
}

// caClient is an HTTP/2 client that trusts the CA.
func caClient(t *testing.T, caFile string) *http.Client {
	t.Helper()
	pool, err := testca.LoadPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: p, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// servedCN dials addr afresh and returns the common name of the
// certificate it shows.
func servedCN(t *testing.T, addr, caFile string) string {
	t.Helper()
	pool, err := testca.LoadPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestTLSReload: `moehost serve --tls-cert` swaps its certificate on
// SIGHUP and when the files change: new handshakes get the new one,
// while a connection made before keeps serving calls; a bad new pair is
// logged and the last good one kept.
func TestTLSReload(t *testing.T) {
	t.Parallel()
	ca, err := testca.New("reload CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	pair := func(cn string) testca.Pair {
		p, err := ca.Server(cn)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	one := pair("one")
	certFile, keyFile, err := one.Write(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	put := func(p testca.Pair) {
		t.Helper()
		if _, _, err := p.Write(dir, "server"); err != nil {
			t.Fatal(err)
		}
	}
	s := serveTLS(t, testca.Files{Cert: certFile, Key: keyFile}, "--experts", "nop.0", "--no-dht")
	addr := strings.TrimPrefix(s.url, "https://")
	hc := caClient(t, caFile)
	// call lists the experts over hc, and returns the served certificate's
	// name and whether the call went on a connection made before.
	call := func() (cn string, reused bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.url+"/moehost.v1.ExpertService/ListExperts", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("ListExperts: %v", err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.ProtoMajor != 2 {
			t.Fatalf("ListExperts: %s over %s", res.Status, res.Proto)
		}
		return res.TLS.PeerCertificates[0].Subject.CommonName, reused
	}
	if cn, _ := call(); cn != "one" {
		t.Fatalf("served %q, want one", cn)
	}
	waitCN := func(want string, within time.Duration) {
		t.Helper()
		waitFor(t, within, "new handshakes get "+want, func() (bool, string) {
			got := servedCN(t, addr, caFile)
			return got == want, got
		})
	}
	openStill := func(when string) {
		t.Helper()
		if cn, reused := call(); cn != "one" || !reused {
			t.Errorf("%s, the open connection served %q (reused %v), want one on the same connection", when, cn, reused)
		}
	}

	// SIGHUP, with a poll too far off to matter: the pair is rewritten
	// and signalled at once.
	put(pair("two"))
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitCN("two", 5*time.Second)
	openStill("after SIGHUP")

	// A change to the files alone, within a few polls.
	put(pair("three"))
	waitCN("three", 10*time.Second)
	openStill("after the files changed")

	// A certificate that does not parse: logged, for the change and
	// again for a SIGHUP, and the last good pair stays.
	if err := os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refusals := func() int {
		return strings.Count(s.logText(), `msg="TLS certificate not reloaded; keeping the previous one"`)
	}
	waitFor(t, 10*time.Second, "the bad pair logged", func() (bool, string) { return refusals() >= 1, s.logText() })
	before := refusals()
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the bad pair logged at SIGHUP", func() (bool, string) { return refusals() > before, s.logText() })
	if got := servedCN(t, addr, caFile); got != "three" {
		t.Errorf("after a bad pair new handshakes get %q, want three", got)
	}
	openStill("after a bad pair")
	if !strings.Contains(s.logText(), `msg="TLS certificate reloaded" why=SIGHUP`) || !strings.Contains(s.logText(), `msg="TLS certificate reloaded" why="files changed"`) {
		t.Errorf("the reloads are not logged with their cause:\n%s", s.logText())
	}
}

// TestTLSClientCA: with --tls-client-ca, a client without a certificate
// is refused at the handshake, and one with a certificate the CA signed
// is served (grpcurl, both ways).
func TestTLSClientCA(t *testing.T) {
	t.Parallel()
	gc := grpcurl(t)
	f := testCA(t)
	s := serveTLS(t, f, "--experts", "nop.0", "--no-dht", "--tls-client-ca", f.CA)
	addr := strings.TrimPrefix(s.url, "https://")
	if !strings.Contains(s.logText(), "client_certs=true") {
		t.Errorf("the start line does not say client certificates are asked for:\n%s", s.logText())
	}
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"with a client certificate", []string{"-cert", f.ClientCert, "-key", f.ClientKey}, true},
		{"without one", nil, false},
		// The server's own pair is no client certificate.
		{"with the server's certificate", []string{"-cert", f.Cert, "-key", f.Key}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"-cacert", f.CA}, tc.args...), addr, "list")
			out, err := exec.Command(gc, args...).CombinedOutput()
			if tc.ok && (err != nil || !strings.Contains(string(out), "moehost.v1.ExpertService\n")) {
				t.Errorf("grpcurl %v: %v\n%s", args, err, out)
			}
			if !tc.ok && (err == nil || !strings.Contains(string(out), "certificate")) {
				t.Errorf("grpcurl %v: %v, want a refusal over the certificate\n%s", args, err, out)
			}
		})
	}
}

// TestTLSGRPCurlAndBufCurl: grpcurl with -cacert and buf curl with
// --cacert list and call the server over TLS, through reflection, on
// the three protocols; without the CA both refuse the server.
func TestTLSGRPCurlAndBufCurl(t *testing.T) {
	t.Parallel()
	gc, buf := grpcurl(t), bufBinary(t)
	f := testCA(t)
	s := serveTLS(t, f, "--experts", "nop.[0:2]", "--no-dht")
	addr := strings.TrimPrefix(s.url, "https://")
	body := `{"uid": "nop.1", "inputs": [{"dtype": "DTYPE_FLOAT32", "shape": [1, 4], "data": "AACAPwAAgD8AAIA/AACAPw=="}]}` // [[1, 1, 1, 1]]
	run := func(bin string, args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	if out, err := run(gc, "-cacert", f.CA, addr, "list"); err != nil || !strings.Contains(out, "moehost.v1.ExpertService\n") {
		t.Errorf("grpcurl list: %v\n%s", err, out)
	}
	if out, err := run(gc, "-cacert", f.CA, "-d", body, addr, "moehost.v1.ExpertService/Forward"); err != nil || !strings.Contains(out, `"AACAPwAAgD8AAIA/AACAPw=="`) {
		t.Errorf("grpcurl Forward: %v\n%s", err, out)
	}
	if out, err := run(gc, addr, "list"); err == nil || !strings.Contains(out, "certificate") {
		t.Errorf("grpcurl without -cacert: %v, want a certificate error\n%s", err, out)
	}
	if out, err := run(buf, "curl", "--cacert", f.CA, "--list-services", s.url); err != nil || !strings.Contains(out, "moehost.v1.ExpertService\n") {
		t.Errorf("buf curl --list-services: %v\n%s", err, out)
	}
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run("buf curl "+protocol, func(t *testing.T) {
			out, err := run(buf, "curl", "--cacert", f.CA, "--protocol", protocol, "-v", "-d", body, s.url+"/moehost.v1.ExpertService/Forward")
			if err != nil || !strings.Contains(out, `"data": "AACAPwAAgD8AAIA/AACAPw=="`) {
				t.Errorf("buf curl Forward: %v\n%s", err, out)
			}
			if !strings.Contains(out, "HTTP/2.0 200") {
				t.Errorf("buf curl did not get HTTP/2 by ALPN:\n%s", out)
			}
		})
	}
	if out, err := run(buf, "curl", "-v", "--list-services", s.url); err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("buf curl without --cacert: %v, want a certificate error\n%s", err, out)
	}
}

// TestTLSCLI: the CLI calls an https:// server with --ca-file or
// $MOEHOST_CA_FILE (forward, experts, checkpoint save, discover --server,
// which prints the https:// URL the DHT record announces); without either
// it fails with a message that names --ca-file.
func TestTLSCLI(t *testing.T) {
	t.Parallel()
	f := testCA(t)
	s := serveTLS(t, f, "--experts", "nop.[0:2]", "--update-period", "1s")
	bin := moehostBinary(t)
	run := func(env []string, args ...string) (string, string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(append(os.Environ(), caFileEnv+"="), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	forward := []string{"forward", "nop.1", "--server", s.url}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"--ca-file", nil, []string{"--ca-file", f.CA}},
		{"$" + caFileEnv, []string{caFileEnv + "=" + f.CA}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := run(tc.env, append(append(forward, "--random", "1"), tc.args...)...)
			if err != nil || !strings.Contains(stdout, `"outputs"`) {
				t.Errorf("forward: %v\n%s%s", err, stdout, stderr)
			}
			stdout, stderr, err = run(tc.env, append([]string{"experts", "--server", s.url}, tc.args...)...)
			if err != nil || !strings.Contains(stdout, "nop.0\t") || !strings.Contains(stdout, "nop.1\t") {
				t.Errorf("experts: %v\n%s%s", err, stdout, stderr)
			}
			// The checkpoint commands have their own --server: a save
			// over https, as the operator on loopback.
			stdout, stderr, err = run(tc.env, append([]string{"checkpoint", "save", "nop.0", "--server", s.url}, tc.args...)...)
			if err != nil || !strings.HasPrefix(stdout, "nop.0\tstep 0\t") {
				t.Errorf("checkpoint save: %v\n%s%s", err, stdout, stderr)
			}
		})
	}
	// The DHT record names the https:// URL.
	waitFor(t, 20*time.Second, "discover --server over https prints the https:// record", func() (bool, string) {
		stdout, stderr, err := run(nil, "discover", "--server", s.url, "--ca-file", f.CA, "nop.1")
		return err == nil && strings.HasPrefix(stdout, "nop.1\t"+s.url+"\t"), stdout + stderr
	})

	// No CA: the refusal, and a hint naming the flag.
	_, stderr, err := run(nil, append(forward, "--random", "1")...)
	if err == nil || !strings.Contains(stderr, "certificate signed by unknown authority") || !strings.Contains(stderr, "--ca-file") || !strings.Contains(stderr, "$"+caFileEnv) {
		t.Errorf("forward without the CA: %v, want an error naming --ca-file and $%s:\n%s", err, caFileEnv, stderr)
	}
	// A CA file that holds none.
	_, stderr, err = run(nil, append(forward, "--random", "1", "--ca-file", f.Key)...)
	if err == nil || !strings.Contains(stderr, "--ca-file") || !strings.Contains(stderr, "no PEM certificate") {
		t.Errorf("forward with a key for a CA: %v\n%s", err, stderr)
	}
}

// caFileEnv is the CLI's environment variable for --ca-file.
const caFileEnv = "MOEHOST_CA_FILE"

// TestReadmeTLS runs the README's TLS lines as written (openssl's
// self-signed certificate, serve with it, forward and grpcurl trusting
// it), on a free port in place of 127.0.0.1:7700.
func TestReadmeTLS(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl:", err)
	}
	blocks := readmeBlocks(t, "## TLS", "\n## ")
	if len(blocks) != 1 {
		t.Fatalf("the TLS section has %d code blocks, want 1", len(blocks))
	}
	block := blocks[0]
	for _, want := range []string{"openssl req -x509", "moehost serve --tls-cert cert.pem --tls-key key.pem &", "--ca-file cert.pem", "grpcurl -cacert cert.pem"} {
		if !strings.Contains(block, want) {
			t.Fatalf("the TLS section's lines have no %q:\n%s", want, block)
		}
	}
	bin, gc := moehostBinary(t), grpcurl(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var script strings.Builder
	script.WriteString("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n")
	for _, line := range strings.Split(block, "\n") {
		line = strings.ReplaceAll(line, "127.0.0.1:7700", addr)
		line = strings.Replace(line, "moehost serve", "moehost serve --listen "+addr+" --module nop --hidden-dim 4", 1)
		script.WriteString(line + "\n")
		if strings.HasSuffix(line, "&") {
			// A plaintext request gets the TLS port's 400: it is up.
			fmt.Fprintf(&script, "for i in $(seq 600); do curl -s -o /dev/null http://%s/ && break; sleep 0.2; done\n", addr)
		}
	}
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+filepath.Dir(gc)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"MOEHOST_TOKEN=", caFileEnv+"=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's TLS lines failed: %v\n%s\n%s", err, script.String(), out)
	}
	for _, want := range []string{`{"outputs":[{"shape":[2,4]`, "moehost.v1.ExpertService\n", "tls=true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the README's TLS lines printed no %q:\n%s", want, out)
		}
	}
}
