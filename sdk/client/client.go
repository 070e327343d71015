// Package client is the Go caller SDK for moehost: it calls experts on a
// server over Connect, gRPC or gRPC-Web.
//
//	c := client.New("http://127.0.0.1:7700")
//	out, err := c.Expert("ffn.0").Forward(ctx, client.Float32([]int64{2, 1024}, x))
//
// An https:// URL speaks TLS, trusting the system's roots; WithTLSConfig
// gives a private CA (RootCAs) or a client certificate.
//
// To find experts, join the DHT swarm with NewSwarm (or ask a server's
// DiscoveryService with NewDiscoveryClient); MixtureOfExperts calls the
// top-k experts of a grid that beam search picks. A tenant trains its own
// experts with its token: WithToken, or $MOEHOST_TOKEN.
package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/sdk/wire"
)

// Option configures a Client.
type Option interface{ apply(*options) }

type options struct {
	http     connect.HTTPClient
	tls      *tls.Config
	protocol string    // "connect", "grpc", "grpcweb"
	wire     abi.DType // float32, float16 or bfloat16
	timeout  time.Duration
	token    *string // nil: $MOEHOST_TOKEN
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithHTTPClient sets the HTTP client. Default: an HTTP/2 client (without
// TLS for http:// URLs), which multiplexes calls on one connection and, on
// a server's graceful shutdown, retries calls the server never started
// instead of failing them with a reset connection.
func WithHTTPClient(c connect.HTTPClient) Option {
	return optionFunc(func(o *options) { o.http = c })
}

// WithTLSConfig sets the TLS config of the HTTP client that New makes,
// for https:// URLs: RootCAs to trust a private CA (see
// x509.CertPool.AppendCertsFromPEM), Certificates for a server that asks
// for client certificates (moehost serve --tls-client-ca). The client
// keeps a clone. Default: the system's roots and no client certificate.
// It is ignored with WithHTTPClient, whose transport has its own.
func WithTLSConfig(c *tls.Config) Option {
	return optionFunc(func(o *options) { o.tls = c.Clone() })
}

// WithTimeout bounds each call of a RemoteExpert (Info, Forward,
// Backward) on top of its context's deadline. Default none.
func WithTimeout(d time.Duration) Option { return optionFunc(func(o *options) { o.timeout = d }) }

// TokenEnv is the environment variable that holds the bearer token a
// client sends when it is given no WithToken.
const TokenEnv = "MOEHOST_TOKEN"

// WithToken sends token as "Authorization: Bearer <token>" on every call
// of the client: a tenant's token (moehost tenant add), with which it may
// train its own experts, or the server's admin token. Default
// $MOEHOST_TOKEN; WithToken("") sends none, whatever the environment says.
func WithToken(token string) Option {
	return optionFunc(func(o *options) { o.token = &token })
}

// WithGRPC makes the client speak gRPC instead of Connect.
func WithGRPC() Option { return optionFunc(func(o *options) { o.protocol = "grpc" }) }

// WithGRPCWeb makes the client speak gRPC-Web instead of Connect.
func WithGRPCWeb() Option { return optionFunc(func(o *options) { o.protocol = "grpcweb" }) }

// WithWireDType sends float32 tensors as dt and asks for float32 results
// in dt, converting both ways in the client: abi.DTypeFloat16 or
// abi.DTypeBFloat16 halve the bytes of every call, at the precision of the
// format (float16: 11 significant bits and a range of ±65504; bfloat16: 8
// bits and float32's range). Callers still pass and get float32 tensors;
// the server computes in float32. abi.DTypeFloat32, the default, sends
// float32. Any other dtype panics in New, as a programming error.
func WithWireDType(dt abi.DType) Option { return optionFunc(func(o *options) { o.wire = dt }) }

// Client calls one moehost server. It is safe for concurrent use.
type Client struct {
	svc     moehostv1connect.ExpertServiceClient
	own     *http.Client // the HTTP client New made, closed by Close
	wire    abi.DType
	timeout time.Duration
	schemas sync.Map // uid → *moehostv1.ExpertInfo, for CheckInputs
}

// New returns a client of the server at baseURL ("http://host:port", or
// "host:port" for plain HTTP; "https://host:port" for TLS).
func New(baseURL string, opts ...Option) *Client {
	hc, url, copts, own := connectSetup(baseURL, opts)
	o := applyOptions(opts)
	if o.wire != abi.DTypeFloat32 && !half.Is(o.wire) {
		panic(fmt.Sprintf("client.WithWireDType(%v): want float32, float16 or bfloat16", o.wire))
	}
	return &Client{svc: moehostv1connect.NewExpertServiceClient(hc, url, copts...), own: own, wire: o.wire, timeout: o.timeout}
}

func applyOptions(opts []Option) options {
	o := options{protocol: "connect", wire: abi.DTypeFloat32}
	for _, opt := range opts {
		opt.apply(&o)
	}
	return o
}

// connectSetup turns options into an HTTP client (own is the one it made,
// if any), a URL and Connect client options.
func connectSetup(baseURL string, opts []Option) (hc connect.HTTPClient, url string, copts []connect.ClientOption, own *http.Client) {
	o := applyOptions(opts)
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	if o.http == nil {
		own = defaultHTTPClient(strings.HasPrefix(baseURL, "http://"), o.tls)
		o.http = own
	}
	switch o.protocol {
	case "grpc":
		copts = append(copts, connect.WithGRPC())
	case "grpcweb":
		copts = append(copts, connect.WithGRPCWeb())
	}
	token := os.Getenv(TokenEnv)
	if o.token != nil {
		token = *o.token
	}
	if token = strings.TrimSpace(token); token != "" {
		copts = append(copts, connect.WithInterceptors(bearer("Bearer "+token)))
	}
	return o.http, baseURL, copts, own
}

// bearer is an interceptor that sets the Authorization header of every
// unary call and stream to its value.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Close closes the idle connections of the HTTP client that New made; a
// client given with WithHTTPClient is left alone. Calls still in flight
// finish.
func (c *Client) Close() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

// defaultHTTPClient speaks HTTP/2: in cleartext (h2c) for http:// URLs,
// and over TLS, with conf, for https:// ones (HTTP/1.1 only where the
// server's ALPN offers no h2).
func defaultHTTPClient(cleartext bool, conf *tls.Config) *http.Client {
	protocols := new(http.Protocols)
	if cleartext {
		protocols.SetUnencryptedHTTP2(true)
	} else {
		protocols.SetHTTP2(true)
		protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: &http.Transport{Protocols: protocols, TLSClientConfig: conf}}
}

// Expert returns a handle to the expert uid on the server. It makes no
// call.
func (c *Client) Expert(uid string) *RemoteExpert { return &RemoteExpert{c: c, uid: uid} }

// ListExperts describes every expert on the server.
func (c *Client) ListExperts(ctx context.Context) ([]*moehostv1.ExpertInfo, error) {
	res, err := c.svc.ListExperts(ctx, connect.NewRequest(&moehostv1.ListExpertsRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetExperts(), nil
}

// RemoteExpert is an expert on a server, like hivemind's RemoteExpert.
type RemoteExpert struct {
	c   *Client
	uid string
}

// UID returns the expert's uid.
func (e *RemoteExpert) UID() string { return e.uid }

// call bounds ctx by the client's timeout.
func (e *RemoteExpert) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.c.timeout > 0 {
		return context.WithTimeout(ctx, e.c.timeout)
	}
	return ctx, func() {}
}

// Info describes the expert.
func (e *RemoteExpert) Info(ctx context.Context) (*moehostv1.ExpertInfo, error) {
	ctx, cancel := e.call(ctx)
	defer cancel()
	res, err := e.c.svc.Info(ctx, connect.NewRequest(&moehostv1.InfoRequest{Uid: e.uid}))
	if err != nil {
		return nil, err
	}
	e.c.schemas.Store(e.uid, res.Msg)
	return res.Msg, nil
}

// CheckInputs checks inputs against the expert's declared input schema,
// which it fetches with Info once per client and uid and then caches; a
// mismatch is a *connect.Error with CodeInvalidArgument, found without
// sending the batch.
func (e *RemoteExpert) CheckInputs(ctx context.Context, inputs ...Tensor) error {
	v, ok := e.c.schemas.Load(e.uid)
	if !ok {
		info, err := e.Info(ctx)
		if err != nil {
			return err
		}
		v = info
	}
	metas := make([]wire.Meta, len(inputs))
	for i, t := range inputs {
		metas[i] = wire.Meta{DType: t.DType, Shape: t.Shape}
	}
	// The server's own check, so that the two cannot disagree.
	if _, err := wire.Fit(v.(*moehostv1.ExpertInfo).GetInputs(), "input", metas, -1); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("expert %s: %w", e.uid, err))
	}
	return nil
}

// Forward computes the expert's outputs for a batch. Errors are
// *connect.Error values; use connect.CodeOf to branch on them.
func (e *RemoteExpert) Forward(ctx context.Context, inputs ...Tensor) ([]Tensor, error) {
	ctx, cancel := e.call(ctx)
	defer cancel()
	w := e.c.wire
	res, err := e.c.svc.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: e.uid, Inputs: toWire(inputs, w), OutputDtype: moehostv1.DType(w)}))
	if err != nil {
		return nil, err
	}
	return fromWire(res.Msg.GetOutputs())
}

// Backward returns the gradients of the inputs given the gradients of the
// outputs; the server also trains the expert one step.
func (e *RemoteExpert) Backward(ctx context.Context, inputs, gradOutputs []Tensor) ([]Tensor, error) {
	w := e.c.wire
	ctx, cancel := e.call(ctx)
	defer cancel()
	res, err := e.c.svc.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{
		Uid: e.uid, Inputs: toWire(inputs, w), GradOutputs: toWire(gradOutputs, w), GradInputDtype: moehostv1.DType(w),
	}))
	if err != nil {
		return nil, err
	}
	return fromWire(res.Msg.GetGradInputs())
}

// Tensor is a tensor on the wire: little-endian, row-major data.
type Tensor struct {
	DType abi.DType
	Shape []int64
	Data  []byte
}

// Float32 makes a float32 tensor. It panics when len(values) does not
// match shape, which is a programming error.
func Float32(shape []int64, values []float32) Tensor {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	if n != int64(len(values)) {
		panic(fmt.Sprintf("client.Float32: %d values for shape %v", len(values), shape))
	}
	return Tensor{DType: abi.DTypeFloat32, Shape: shape, Data: wire.Encode(abi.DTypeFloat32, values)}
}

// Float32s returns the values of a float32 tensor.
func (t Tensor) Float32s() ([]float32, error) {
	if t.DType != abi.DTypeFloat32 || len(t.Data)%4 != 0 {
		return nil, fmt.Errorf("tensor is %v with %d bytes, not float32", t.DType, len(t.Data))
	}
	return wire.Decode(abi.DTypeFloat32, t.Data)
}

// toWire converts tensors to wire tensors, narrowing float32 ones to wire
// when it is a 16-bit float.
func toWire(ts []Tensor, dt abi.DType) []*moehostv1.Tensor {
	out := make([]*moehostv1.Tensor, len(ts))
	for i, t := range ts {
		out[i] = &moehostv1.Tensor{Dtype: moehostv1.DType(t.DType), Shape: t.Shape, Data: t.Data}
		if t.DType != abi.DTypeFloat32 || !half.Is(dt) || len(t.Data)%4 != 0 {
			continue // the server reports what is wrong with a bad tensor
		}
		f, _ := t.Float32s()
		out[i] = wire.Tensor(t.Shape, f, dt)
	}
	return out
}

// fromWire converts wire tensors to tensors, widening 16-bit floats to
// float32, so that callers get the dtypes they would without
// WithWireDType.
func fromWire(pbs []*moehostv1.Tensor) ([]Tensor, error) {
	out := make([]Tensor, len(pbs))
	for i, pb := range pbs {
		t := Tensor{DType: abi.DType(pb.GetDtype()), Shape: pb.GetShape(), Data: pb.GetData()}
		if half.Is(t.DType) {
			f, err := wire.Decode(t.DType, t.Data)
			if err != nil {
				return nil, fmt.Errorf("result %d: %w", i, err)
			}
			t = Tensor{DType: abi.DTypeFloat32, Shape: t.Shape, Data: wire.Encode(abi.DTypeFloat32, f)}
		}
		out[i] = t
	}
	return out, nil
}
