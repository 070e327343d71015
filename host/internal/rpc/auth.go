package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/sdk/wire"
)

// Caller is who made a request, as the token it presented says.
type Caller struct {
	// Tenant names the caller's tenant; "" is an anonymous caller, one
	// that presented no token.
	Tenant string
	// Operator is set for the server's operator, who owns the experts
	// given on the command line.
	Operator bool
}

// Anonymous reports whether the caller presented no token.
func (c Caller) Anonymous() bool { return c.Tenant == "" && !c.Operator }

// Authenticator turns bearer tokens into callers; package host implements
// it with the tenants file. Authenticate must take the same time whatever
// part of token matches (compare hashes in constant time), and must be
// safe for concurrent use.
type Authenticator interface {
	// Authenticate returns the caller token belongs to, and false for a
	// token that no tenant holds.
	Authenticate(token string) (Caller, bool)
}

type callerKey struct{}

// ContextWithCaller returns ctx carrying c, as the handler's interceptor
// does for each request; tests of Modules implementations use it too.
func ContextWithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller of the request ctx belongs to: the
// anonymous Caller when it presented no token, or when the server has no
// Authenticator.
func CallerFrom(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// Access is sdk/wire's: who may call one of an expert's procedures. The
// handler resolves the wire's ACCESS_UNSPECIFIED to the procedure's
// default (DefaultForward, DefaultBackward) before a Modules
// implementation sees it.
type Access = wire.Access

// The accesses, and the defaults for ACCESS_UNSPECIFIED.
const (
	AccessPublic    = wire.AccessPublic
	AccessOwner     = wire.AccessOwner
	AccessTenants   = wire.AccessTenants
	DefaultForward  = wire.DefaultForward
	DefaultBackward = wire.DefaultBackward
)

// Check returns nil when c may call a procedure with access a of an
// expert owned by owner ("" for the operator's experts), and otherwise an
// Unauthenticated *connect.Error (an anonymous caller, who could get in
// with a token) or a PermissionDenied one. what names the call in the
// message ("forward \"alice.ffn.0\""). It is Caller's, not Access's,
// because Access is the wire's and the check the server's.
//
// Each refusal names the way in: its owner's token for a tenant's expert,
// any tenant's where tenants may call, and for the operator's experts the
// server's admin token or, for Backward, a server started with
// --public-backward.
func (c Caller) Check(a Access, owner, what string) error {
	switch {
	case a == AccessPublic:
		return nil
	case c.Operator:
		return nil
	case c.Anonymous() && a == AccessTenants:
		return errorf(connect.CodeUnauthenticated, "%s needs a token (Authorization: Bearer <token>): any tenant's", what)
	case c.Anonymous() && owner == "":
		return errorf(connect.CodeUnauthenticated, "%s needs a token (Authorization: Bearer <token>): %s", what, operatorWayIn)
	case c.Anonymous():
		return errorf(connect.CodeUnauthenticated, "%s needs a token (Authorization: Bearer <token>): its owner's", what)
	case a == AccessTenants:
		return nil
	case a == AccessOwner && owner != "" && c.Tenant == owner:
		return nil
	case a == AccessOwner && owner == "":
		return errorf(connect.CodePermissionDenied, "%s is open to its owner only: %s", what, operatorWayIn)
	case a == AccessOwner:
		return errorf(connect.CodePermissionDenied, "%s is open to its owner only: send its owner's token", what)
	}
	return errorf(connect.CodeInternal, "%s: BUG: access %v", what, a)
}

// operatorWayIn says how to call an operator's expert that is not public.
const operatorWayIn = "the operator's experts take the server's --admin-token; --public-backward opens their Backward to all"

// authGate's caller, as a gate, puts the request's Caller in its context. With
// required, a request without a token is refused; a token that no tenant
// holds is refused either way, so that a typo is not served as anonymous.
type authGate struct {
	auth     Authenticator
	required bool
	service  string // for messages
}

func (a authGate) caller(ctx context.Context, _ connect.Peer, h http.Header) (context.Context, error) {
	token, present, err := BearerToken(h)
	if err != nil {
		return nil, err
	}
	if !present {
		if a.required {
			return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%s needs a token (Authorization: Bearer <token>): a tenant's, or the server's admin token", a.service))
		}
		return ContextWithCaller(ctx, Caller{}), nil
	}
	c, ok := a.auth.Authenticate(token)
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("the bearer token is not valid on this server"))
	}
	return ContextWithCaller(ctx, c), nil
}

// BearerToken is the one parser of the Authorization header that every
// service uses: present is false when the header is absent or empty, and
// err (Unauthenticated) is set when it is present but not "Bearer
// <token>". The scheme is case-insensitive (RFC 9110, section 11.1), and
// the token is what follows the spaces after it, trimmed.
func BearerToken(h http.Header) (token string, present bool, err error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", false, nil
	}
	scheme, rest, _ := strings.Cut(v, " ")
	token = strings.TrimSpace(rest)
	if !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return "", true, connect.NewError(connect.CodeUnauthenticated, errors.New("the Authorization header is not \"Bearer <token>\""))
	}
	return token, true, nil
}

// gate is a Connect interceptor that admits each unary call and each
// stream with the function before its handler runs, passing on the
// context the function returns (where authGate.caller puts the Caller).
type gate func(ctx context.Context, peer connect.Peer, h http.Header) (context.Context, error)

func (g gate) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := g(ctx, req.Peer(), req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (g gate) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (g gate) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := g(ctx, conn.Peer(), conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
