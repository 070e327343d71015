//go:build !wasip1

package expert

import "github.com/moehost/moehost/abi"

// Outside a guest every host call fails with ErrNotInGuest.

func notInGuest() int32 { return int32(abi.ErrInternal) }

func hostConfigI64(keyPtr, keyLen, outPtr uint32) int32         { return notInGuest() }
func hostDeclareInput(_, _ uint32, _ int32, _, _ uint32) int32  { return notInGuest() }
func hostDeclareOutput(_, _ uint32, _ int32, _, _ uint32) int32 { return notInGuest() }
func hostParamNew(_, _ uint32, _ int32, _, _ uint32, _ int32, _, _ float64) int32 {
	return notInGuest()
}
func hostInput(int32) int32                              { return notInGuest() }
func hostOutput(_, _ int32) int32                        { return notInGuest() }
func hostTensorNew(int32, uint32, uint32) int32          { return notInGuest() }
func hostTensorWrite(int32, uint32, uint32) int32        { return notInGuest() }
func hostTensorRead(int32, uint32, uint32) int32         { return notInGuest() }
func hostTensorShape(int32, uint32, uint32) int32        { return notInGuest() }
func hostOp(int32, uint32, uint32, uint32, uint32) int32 { return notInGuest() }
func hostOpMulti(int32, uint32, uint32, uint32, uint32, uint32, uint32) int32 {
	return notInGuest()
}
func hostGradOutput(int32) int32       { return notInGuest() }
func hostGradInput(int32, int32) int32 { return notInGuest() }
func hostParamGrad(int32, int32) int32 { return notInGuest() }

// RunBackward fails outside a guest.
func RunBackward() int32 { return notInGuest() }

func hostFail(uint32, uint32) int32  { return 0 }
func lastError() string              { return ErrNotInGuest.Error() }
func strPtr(string) (uint32, uint32) { return 0, 0 }
func ptr64([]int64) uint32           { return 0 }
func ptr32([]float32) uint32         { return 0 }
func ptrI32([]int32) uint32          { return 0 }
func ptrF64([]float64) uint32        { return 0 }
