package rpc

import (
	"fmt"
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

// needContentType answers a POST without a Content-Type with 415 and a
// body that says what to send; connect's handlers answer it with an empty
// 415, which leaves a curl user guessing.
func needContentType(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnsupportedMediaType)
			fmt.Fprintln(w, "a POST needs a Content-Type: application/json (Connect with JSON, e.g. curl -H 'Content-Type: application/json'), application/proto (Connect with protobuf), application/grpc or application/grpc-web+proto")
			return
		}
		next.ServeHTTP(w, r)
	})
}
