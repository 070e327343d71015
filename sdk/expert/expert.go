// Package expert is the Go guest SDK for moehost: it turns a Go package
// into an expert module that moehost runs in its Wasm sandbox.
//
// An expert declares its inputs, outputs and parameters in Init and
// computes a batch in Forward. Tensors stay on the host; the SDK holds
// handles and calls the host's kernels through the ABI in package abi.
// Gradients need no code: for a backward request the host records the ops
// of Forward on its tape and differentiates them.
//
// Build an expert with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o expert.wasm .
//
// and register it from an init function of package main:
//
//	func init() { expert.Register(&ffn{}) }
//
// Outside a wasip1 build the package compiles, so that tools and docs work,
// but every host call fails with [ErrNotInGuest].
package expert

import (
	"errors"

	"github.com/moehost/moehost/abi"
)

// The SDK speaks ABI v1; this fails to compile against another major.
const _ = abi.IsVersion1

// DType is an element type.
type DType = abi.DType

// Element types.
const (
	Float32 = abi.DTypeFloat32
	Int32   = abi.DTypeInt32
	Int64   = abi.DTypeInt64
	Bool    = abi.DTypeBool
)

// Batch is the batch dimension in a declared shape.
const Batch = abi.BatchDim

// ErrNotInGuest is returned by every host call when the SDK is not running
// inside a moehost guest.
var ErrNotInGuest = errors.New("moehost expert SDK: not running in a wasip1 guest")

// Expert is the code of one expert module.
type Expert interface {
	// Init declares inputs, outputs and parameters. It runs once per
	// instance, before any Forward.
	Init(c *InitContext) error
	// Forward computes one batch. It must set every declared output.
	Forward(c *Call) error
}

var registered Expert

// Register makes e the module's expert. Call it once, from an init
// function; a second call panics.
func Register(e Expert) {
	if registered != nil {
		panic("expert: Register called twice")
	}
	registered = e
}

// HostError is an error code returned by the host with its message.
type HostError struct {
	Func  string    // host function, e.g. "op"
	Errno abi.Errno // the code
	Msg   string    // the host's message
}

func (e *HostError) Error() string {
	return "moehost " + e.Func + ": " + e.Errno.String() + ": " + e.Msg
}

// Unwrap lets errors.Is match the abi.Errno.
func (e *HostError) Unwrap() error { return e.Errno }

// check turns a host result into an error, fetching the host's message.
func check(fn string, r int32) (int32, error) {
	if r >= 0 {
		return r, nil
	}
	return r, &HostError{Func: fn, Errno: abi.Errno(r), Msg: lastError()}
}
