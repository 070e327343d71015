package rpc

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
)

// Code pairs a sentinel error with the Connect code of every error that
// wraps it.
type Code struct {
	Err  error
	Code connect.Code
}

// Codes is the one table from the sentinels of the rooms behind the
// handlers (the expert table, the sandbox, the pools, tenants, modules,
// checkpoints, discovery) to Connect codes. Package host builds it and
// hands it to every service it serves, so that no room speaks the
// transport's vocabulary. An error that is or wraps a *connect.Error
// keeps that error's code (this package's own refusals of a request);
// otherwise the first entry whose Err the error wraps (errors.Is) chooses,
// so a table lists the errors that say where a failure happened before
// the ones that say what it was. An error that wraps none is Internal: a
// host bug.
type Codes []Code

// Of returns the Connect code for err.
func (cs Codes) Of(err error) connect.Code {
	if ce := new(connect.Error); errors.As(err, &ce) {
		return ce.Code()
	}
	for _, c := range cs {
		if errors.Is(err, c.Err) {
			return c.Code
		}
	}
	return connect.CodeInternal
}

// Coded returns err as a *connect.Error with the code Of chooses, and
// err's own message, or nil for nil. An error that wraps a
// *connect.Error is returned as it is: connect-go answers with the code
// and message of the one it wraps.
func (cs Codes) Coded(err error) error {
	if err == nil {
		return nil
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return err
	}
	return connect.NewError(cs.Of(err), err)
}

// Interceptor returns a Connect interceptor that turns every handler
// error, unary or streaming, into a *connect.Error coded by cs.
func (cs Codes) Interceptor() connect.Interceptor { return codedInterceptor{cs} }

type codedInterceptor struct{ codes Codes }

func (i codedInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		return res, i.codes.Coded(err)
	}
}

func (codedInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i codedInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return i.codes.Coded(next(ctx, conn))
	}
}

// errorf is this package's refusal of a request: a *connect.Error with
// code and the formatted message.
func errorf(code connect.Code, format string, args ...any) error {
	return connect.NewError(code, fmt.Errorf(format, args...))
}
