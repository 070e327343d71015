package rpc

import (
	"context"
	"net/http"

	"connectrpc.com/connect"
	connectcors "connectrpc.com/cors"
	"github.com/rs/cors"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// Server is the server as a whole, as ServerService sees it; package host
// implements it.
type Server interface {
	// Describe returns a fresh description of the server. The handler
	// owns the returned message.
	Describe() *moehostv1.GetServerInfoResponse
}

type serverService struct {
	server Server
}

func (s serverService) GetServerInfo(context.Context, *connect.Request[moehostv1.GetServerInfoRequest]) (*connect.Response[moehostv1.GetServerInfoResponse], error) {
	return connect.NewResponse(s.server.Describe()), nil
}

// withCORS lets browsers on the given origins call every Connect, gRPC-Web
// and gRPC procedure of h, answering their preflight requests. An origin
// is a scheme, host and port ("https://example.org:8443"), or "*" for any;
// with no origins h is returned as it is, and browsers keep their
// same-origin rule.
func withCORS(h http.Handler, origins []string) http.Handler {
	if len(origins) == 0 {
		return h
	}
	return cors.New(cors.Options{
		AllowedOrigins: origins,
		AllowedMethods: connectcors.AllowedMethods(),
		AllowedHeaders: append(connectcors.AllowedHeaders(), "Authorization"),
		ExposedHeaders: connectcors.ExposedHeaders(),
		// Browsers cache a preflight answer for up to two hours.
		MaxAge: 7200,
	}).Handler(h)
}

var _ moehostv1connect.ServerServiceHandler = serverService{}
