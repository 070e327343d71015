//go:build wasip1

package custombackward

import "github.com/moehost/moehost/sdk/expert"

//go:wasmexport moe_backward
func moeBackward() int32 { return expert.RunBackward() }
