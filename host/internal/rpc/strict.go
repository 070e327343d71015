package rpc

import (
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSON is connect's JSON codec without DiscardUnknown: a request
// with {"uuid": …} is refused naming the unknown field, instead of
// decoding as an empty uid and failing on that. Binary protobuf stays
// lenient, as the wire format's compatibility rules expect.
type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(m any) ([]byte, error) {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a proto.Message", m)
	}
	return protojson.MarshalOptions{}.Marshal(msg)
}

func (c strictJSON) Unmarshal(b []byte, m any) error {
	msg, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto.Message", m)
	}
	if len(b) == 0 {
		b = []byte("{}") // connect's codec takes an empty body as an empty message
	}
	return protojson.UnmarshalOptions{}.Unmarshal(b, msg)
}

// strictJSONCodecs replaces both names connect registers JSON under.
func strictJSONCodecs() connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithCodec(strictJSON{"json"}),
		connect.WithCodec(strictJSON{"json; charset=utf-8"}),
	)
}

// contentTypeHelp is the body of every 415 and 405 the procedures
// answer: connect's handlers send both empty, so `curl -s` printed
// nothing for the commonest curl mistakes (no Content-Type, where curl -d
// sends a form encoding; text/plain; a GET).
const contentTypeHelp = "send a POST with Content-Type: application/json (Connect with JSON), application/proto (Connect with protobuf), application/grpc or application/grpc-web+proto; " +
	"e.g. curl -H 'Content-Type: application/json' -d '{\"uid\": \"ffn.0\"}' http://HOST/moehost.v1.ExpertService/Info\n"

// needContentType makes every 415 (unsupported content type) and 405
// (method) of the procedures say what to send. A POST without a
// Content-Type is answered here; connect answers the rest, and
// helpfulStatus adds the body to its empty answer, so that the rules for
// what connect accepts stay connect's. m counts every 415 and 405.
func needContentType(next http.Handler, m *Metrics) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Content-Type") == "" {
			m.refuse(refusedContentType)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnsupportedMediaType)
			io.WriteString(w, contentTypeHelp)
			return
		}
		next.ServeHTTP(&helpfulStatus{ResponseWriter: w, metrics: m}, r)
	})
}

// helpfulStatus writes contentTypeHelp after a 415 or 405 whose writer
// set no Content-Type (connect's, which writes no body with either), and
// drops whatever body follows. Other statuses pass through untouched.
type helpfulStatus struct {
	http.ResponseWriter
	metrics *Metrics
	helped  bool
}

func (w *helpfulStatus) WriteHeader(code int) {
	switch code {
	case http.StatusUnsupportedMediaType:
		w.metrics.refuse(refusedContentType)
	case http.StatusMethodNotAllowed:
		w.metrics.refuse(refusedMethod)
	}
	if (code == http.StatusUnsupportedMediaType || code == http.StatusMethodNotAllowed) && w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.ResponseWriter.WriteHeader(code)
		io.WriteString(w.ResponseWriter, contentTypeHelp)
		w.helped = true
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *helpfulStatus) Write(b []byte) (int, error) {
	if w.helped {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush and Unwrap keep streaming (connect flushes each message) and
// http.ResponseController working through the wrapper.
func (w *helpfulStatus) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *helpfulStatus) Unwrap() http.ResponseWriter { return w.ResponseWriter }
