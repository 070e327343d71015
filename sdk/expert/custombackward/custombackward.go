// Package custombackward makes a Go expert module export moe_backward, so
// that the host calls the expert's own Backward (see expert.Backwarder)
// instead of differentiating its Forward. Import it for its effect:
//
//	import _ "github.com/moehost/moehost/sdk/expert/custombackward"
//
// It is a package of its own because an export cannot be made optional:
// every module built with package expert alone keeps the host's tape.
package custombackward
