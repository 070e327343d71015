//go:build wasip1

package expert

import (
	"errors"
	"unsafe"

	"github.com/moehost/moehost/abi"
)

// Host functions of abi.ModuleName; see package abi for their contracts.

//go:wasmimport moehost_v1 last_error
func hostLastError(ptr, cap uint32) int32

//go:wasmimport moehost_v1 config_i64
func hostConfigI64(keyPtr, keyLen, outPtr uint32) int32

//go:wasmimport moehost_v1 declare_input
func hostDeclareInput(namePtr, nameLen uint32, dtype int32, shapePtr, rank uint32) int32

//go:wasmimport moehost_v1 declare_output
func hostDeclareOutput(namePtr, nameLen uint32, dtype int32, shapePtr, rank uint32) int32

//go:wasmimport moehost_v1 param_new
func hostParamNew(namePtr, nameLen uint32, dtype int32, shapePtr, rank uint32, init int32, a, b float64) int32

//go:wasmimport moehost_v1 input
func hostInput(index int32) int32

//go:wasmimport moehost_v1 output
func hostOutput(index, handle int32) int32

//go:wasmimport moehost_v1 tensor_new
func hostTensorNew(dtype int32, shapePtr, rank uint32) int32

//go:wasmimport moehost_v1 tensor_write
func hostTensorWrite(handle int32, ptr, n uint32) int32

//go:wasmimport moehost_v1 tensor_read
func hostTensorRead(handle int32, ptr, n uint32) int32

//go:wasmimport moehost_v1 tensor_shape
func hostTensorShape(handle int32, shapePtr, cap uint32) int32

//go:wasmimport moehost_v1 op
func hostOp(code int32, argsPtr, nargs, attrsPtr, nattrs uint32) int32

//go:wasmimport moehost_v1 op_multi
func hostOpMulti(code int32, argsPtr, nargs, attrsPtr, nattrs, outPtr, outCap uint32) int32

//go:wasmimport moehost_v1 fail
func hostFail(ptr, n uint32) int32

//go:wasmimport moehost_v1 grad_output
func hostGradOutput(index int32) int32

//go:wasmimport moehost_v1 grad_input
func hostGradInput(index, handle int32) int32

//go:wasmimport moehost_v1 param_grad
func hostParamGrad(param, grad int32) int32

func lastError() string {
	n := hostLastError(0, 0)
	if n <= 0 {
		return ""
	}
	buf := make([]byte, n)
	hostLastError(uint32(uintptr(unsafe.Pointer(&buf[0]))), uint32(n))
	return string(buf)
}

// Pointers into guest memory. Go's wasm GC does not move objects, and
// every caller keeps the slice alive across the host call.

func strPtr(s string) (uint32, uint32) {
	if s == "" {
		return 0, 0
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.StringData(s)))), uint32(len(s))
}

func ptr64(s []int64) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&s[0])))
}

func ptr32(s []float32) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&s[0])))
}

func ptrI32(s []int32) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&s[0])))
}

func ptrF64(s []float64) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&s[0])))
}

//go:wasmexport moe_abi_version
func moeABIVersion() int32 { return abi.Version }

//go:wasmexport moe_init
func moeInit() int32 {
	if registered == nil {
		return failMsg("expert: no expert registered; call expert.Register in an init function")
	}
	if err := registered.Init(&InitContext{}); err != nil {
		return failWith(err)
	}
	return 0
}

//go:wasmexport moe_forward
func moeForward() int32 {
	if err := registered.Forward(&Call{}); err != nil {
		return failWith(err)
	}
	return 0
}

// RunBackward runs the registered expert's Backward. Package
// custombackward's moe_backward export calls it; experts do not.
func RunBackward() int32 {
	b, ok := registered.(Backwarder)
	if !ok {
		return failMsg("expert: the module exports moe_backward but its expert has no Backward method")
	}
	if err := b.Backward(&BackwardCall{}); err != nil {
		return failWith(err)
	}
	return 0
}

// failMsg reports a misuse of the SDK to the host.
func failMsg(msg string) int32 {
	p, n := strPtr(msg)
	hostFail(p, n)
	return int32(abi.ErrInvalidArgument)
}

// failWith reports err to the host and returns its code.
func failWith(err error) int32 {
	p, n := strPtr(err.Error())
	hostFail(p, n)
	return errnoOf(err)
}

// errnoOf is what an export returns for err.
func errnoOf(err error) int32 {
	var he *HostError
	if errors.As(err, &he) {
		return int32(he.Errno)
	}
	return int32(abi.ErrInvalidArgument)
}
