package abi

// DType is an element type. The numbers match moehost.v1.DType on the wire.
type DType int32

// Element types. Float32 is the compute type of ABI v1; the integer types
// carry ids and masks. Float16 and BFloat16 are reserved for storage and
// wire compression.
const (
	DTypeInvalid  DType = 0
	DTypeFloat32  DType = 1
	DTypeFloat16  DType = 2
	DTypeBFloat16 DType = 3
	DTypeInt32    DType = 4
	DTypeInt64    DType = 5
	DTypeBool     DType = 6
)

// Size returns the size of one element in bytes, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case DTypeFloat32, DTypeInt32:
		return 4
	case DTypeFloat16, DTypeBFloat16:
		return 2
	case DTypeInt64:
		return 8
	case DTypeBool:
		return 1
	}
	return 0
}

// Valid reports whether d is a known dtype.
func (d DType) Valid() bool { return d.Size() > 0 }

// String returns the dtype's lower-case name, as PyTorch spells it.
func (d DType) String() string {
	switch d {
	case DTypeFloat32:
		return "float32"
	case DTypeFloat16:
		return "float16"
	case DTypeBFloat16:
		return "bfloat16"
	case DTypeInt32:
		return "int32"
	case DTypeInt64:
		return "int64"
	case DTypeBool:
		return "bool"
	}
	return "invalid"
}
