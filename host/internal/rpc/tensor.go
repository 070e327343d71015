package rpc

import (
	"fmt"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/wire"
)

// CheckWireDType validates the dtype a caller asks float32 results in:
// unspecified and float32 mean float32, and float16 and bfloat16 halve
// them. It returns the dtype to send.
func CheckWireDType(dt moehostv1.DType) (abi.DType, error) {
	switch d := abi.DType(dt); {
	case dt == moehostv1.DType_DTYPE_UNSPECIFIED || d == abi.DTypeFloat32:
		return abi.DTypeFloat32, nil
	case half.Is(d):
		return d, nil
	default:
		return 0, fmt.Errorf("dtype %v: float32 results can be sent as float32, float16 or bfloat16", d)
	}
}

// SpecString renders a schema as name:float32[-1,1024] (wire.SpecString).
func SpecString(s *moehostv1.TensorSchema) string { return wire.SpecString(s) }

// SchemaString renders a list of schemas (wire.SchemaString).
func SchemaString(ss []*moehostv1.TensorSchema) string { return wire.SchemaString(ss) }
