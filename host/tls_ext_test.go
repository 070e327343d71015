package host_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/internal/testing/testca"
	"github.com/moehost/moehost/sdk/client"
)

// tlsFiles writes a test CA's server and client pairs to a temp dir.
func tlsFiles(t *testing.T) (testca.Files, *tls.Config) {
	t.Helper()
	f, err := testca.WriteAll(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := testca.LoadPool(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	return f, &tls.Config{RootCAs: ca}
}

func startTLS(t *testing.T, c host.TLSConfig, opts ...host.Option) *host.Server {
	t.Helper()
	opts = append([]host.Option{host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()), host.WithTLS(c),
		host.WithExperts(host.ExpertConfig{UID: "nop.0", Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}})}, opts...)
	srv, err := host.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return srv
}

// protoRecorder is a transport that keeps the protocol of the last
// response.
type protoRecorder struct {
	rt    http.RoundTripper
	proto atomic.Value
}

func (p *protoRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := p.rt.RoundTrip(r)
	if err == nil {
		p.proto.Store(res.Proto)
	}
	return res, err
}

var nopX = []float32{1, -2, 3.5, 4, 1e-7, -3e5, 0.25, 7}

// forwardNop calls nop.0 with nopX through c and checks it returned it.
func forwardNop(ctx context.Context, c moehostv1connect.ExpertServiceClient) error {
	data := make([]byte, 4*len(nopX))
	for i, v := range nopX {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	req := &moehostv1.ForwardRequest{Uid: "nop.0", Inputs: []*moehostv1.Tensor{{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{2, 4}, Data: data}}}
	res, err := c.Forward(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	if out := res.Msg.GetOutputs(); len(out) != 1 || !bytes.Equal(out[0].GetData(), data) {
		return fmt.Errorf("nop returned %v, want its input", out)
	}
	return nil
}

// TestTLSProtocols: over TLS the port serves Connect, gRPC and gRPC-Web,
// on HTTP/2 chosen by ALPN and on HTTP/1.1 where the protocol allows it;
// the dashboard too; the DHT announces https://; a plaintext client gets
// an error, and garbage on the port hurts nobody.
func TestTLSProtocols(t *testing.T) {
	t.Parallel()
	files, conf := tlsFiles(t)
	srv := startTLS(t, host.TLSConfig{CertFile: files.Cert, KeyFile: files.Key}, host.WithDHT(host.DHTConfig{}))
	base := "https://" + srv.Addr()
	ctx := context.Background()

	for _, tc := range []struct {
		name, proto string
		h1          bool
		opts        []connect.ClientOption
	}{
		{"connect over h2", "HTTP/2.0", false, nil},
		{"connect over HTTP/1.1", "HTTP/1.1", true, nil},
		{"grpc over h2", "HTTP/2.0", false, []connect.ClientOption{connect.WithGRPC()}},
		{"grpc-web over h2", "HTTP/2.0", false, []connect.ClientOption{connect.WithGRPCWeb()}},
		{"grpc-web over HTTP/1.1", "HTTP/1.1", true, []connect.ClientOption{connect.WithGRPCWeb()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := new(http.Protocols)
			if tc.h1 {
				p.SetHTTP1(true)
			} else {
				p.SetHTTP2(true)
			}
			// A transport that speaks h2 adds it to its config's NextProtos.
			rec := &protoRecorder{rt: &http.Transport{Protocols: p, TLSClientConfig: conf.Clone()}}
			hc := &http.Client{Transport: rec}
			defer hc.CloseIdleConnections()
			if err := forwardNop(ctx, moehostv1connect.NewExpertServiceClient(hc, base, tc.opts...)); err != nil {
				t.Fatal(err)
			}
			if got := rec.proto.Load(); got != tc.proto {
				t.Errorf("served over %v, want %s", got, tc.proto)
			}
		})
	}

	// The Go client, with the CA, speaks h2 to an https URL.
	c := client.New(base, client.WithTLSConfig(conf))
	defer c.Close()
	if out, err := c.Expert("nop.0").Forward(ctx, client.Float32([]int64{2, 4}, nopX)); err != nil {
		t.Errorf("client over https: %v", err)
	} else if got, _ := out[0].Float32s(); !slices.Equal(got, nopX) {
		t.Errorf("client over https: got %v", got)
	}
	// Without it, the system's roots know no test CA.
	if _, err := client.New(base).Expert("nop.0").Info(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA: %v, want a certificate error", err)
	}

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf.Clone()}}
	defer hc.CloseIdleConnections()
	res, err := hc.Get(base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "<html") {
		t.Errorf("GET /ui/ over https: %s", res.Status)
	}

	info, ok := srv.DHT()
	if !ok || !slices.Equal(info.URLs, []string{base}) {
		t.Errorf("the DHT announces %v, want [%s]", info.URLs, base)
	}

	// Plaintext: h2c fails, HTTP/1.1 gets net/http's 400.
	if _, err := client.New("http://" + srv.Addr()).Expert("nop.0").Info(ctx); err == nil {
		t.Error("a plaintext h2c call to the TLS port succeeded")
	}
	res, err = http.Get("http://" + srv.Addr() + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("plaintext HTTP/1.1 to the TLS port: %s, want 400", res.Status)
	}

	// Garbage (the server hangs up at once), a ClientHello cut short and
	// a connection that sends nothing (both left open): the port still
	// serves.
	junk := make([]byte, 64<<10)
	rand.Read(junk)
	hello := []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}
	for _, tc := range []struct {
		b      []byte
		hangup bool
	}{{junk, true}, {append(hello[:5:5], junk...), true}, {hello, false}, {nil, false}} {
		conn, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write(tc.b)
		if tc.hangup {
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			// A close with our bytes unread is a reset.
			if _, err := io.Copy(io.Discard, bufio.NewReader(conn)); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("the server did not hang up on garbage: %v", err)
			}
		}
	}
	if err := forwardNop(ctx, moehostv1connect.NewExpertServiceClient(hc, base)); err != nil {
		t.Errorf("after garbage: %v", err)
	}
}

// TestTLSClientCertificates: with a client CA, a client without a
// certificate is refused and one with a certificate the CA signed is
// served.
func TestTLSClientCertificates(t *testing.T) {
	t.Parallel()
	files, conf := tlsFiles(t)
	srv := startTLS(t, host.TLSConfig{CertFile: files.Cert, KeyFile: files.Key, ClientCAFile: files.CA})
	pair, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	withCert := conf.Clone()
	withCert.Certificates = []tls.Certificate{pair}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		conf *tls.Config
		ok   bool
	}{
		{"without a certificate", conf, false},
		{"with one the CA signed", withCert, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := client.New("https://"+srv.Addr(), client.WithTLSConfig(tc.conf))
			defer c.Close()
			_, err := c.Expert("nop.0").Info(ctx)
			if tc.ok && err != nil {
				t.Errorf("refused: %v", err)
			}
			// Under TLS 1.3 the client learns of the refusal after its
			// handshake: the alert ("certificate required") or, when
			// the HTTP/2 preface read comes first, the transport's
			// "client conn could not be established" wrapping it.
			if !tc.ok && err == nil {
				t.Error("served a client without a certificate")
			}
			if !tc.ok {
				t.Logf("without a certificate: %v", err)
			}
		})
	}
}

// TestTLSNeedsBothFiles: New refuses half a pair, and Start a file that
// does not load, naming it.
func TestTLSNeedsBothFiles(t *testing.T) {
	t.Parallel()
	files, _ := tlsFiles(t)
	if _, err := host.New(host.WithTLS(host.TLSConfig{CertFile: files.Cert})); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("New with a certificate and no key: %v", err)
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()), host.WithTLS(host.TLSConfig{CertFile: files.Key, KeyFile: files.Key}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err == nil || !strings.Contains(err.Error(), files.Key) {
		t.Errorf("Start with a key for a certificate: %v, want an error naming the file", err)
	}
}
