package tests

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"os/exec"
	"strings"
	"testing"
)

// TestGRPCurl lists, describes and calls the server with grpcurl, a
// client we did not write, through server reflection only.
func TestGRPCurl(t *testing.T) {
	t.Parallel()
	gc := grpcurl(t)
	addr := strings.TrimPrefix(serve(t, "--experts", "nop.[0:2]").url, "http://")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(gc, append([]string{"-plaintext"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	list := run(addr, "list")
	for _, svc := range []string{
		"moehost.v1.ExpertService", "grpc.health.v1.Health",
		// Served on loopback without tenants or an admin token.
		"moehost.v1.CheckpointService",
		"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection",
	} {
		if !strings.Contains(list, svc+"\n") {
			t.Errorf("grpcurl list does not show %s:\n%s", svc, list)
		}
	}
	// Whatever list shows, describe resolves.
	for _, svc := range strings.Fields(list) {
		if out := run(addr, "describe", svc); !strings.Contains(out, svc+" is a service") {
			t.Errorf("grpcurl describe %s:\n%s", svc, out)
		}
	}
	// The comments come from the source info in the reflected descriptors.
	for sym, comment := range map[string]string{
		"moehost.v1.ExpertService.Forward": "Forward runs the expert on a batch of inputs",
		"moehost.v1.ForwardRequest":        "output_dtype asks for the float32 outputs",
		"moehost.v1.DType":                 "DTYPE_BFLOAT16 is bfloat16",
	} {
		if out := run(addr, "describe", sym); !strings.Contains(out, comment) {
			t.Errorf("grpcurl describe %s does not show the comment %q:\n%s", sym, comment, out)
		}
	}
	x := make([]byte, 16)
	for i, v := range []float32{1, -2, 3.5, 4} {
		binary.LittleEndian.PutUint32(x[4*i:], math.Float32bits(v))
	}
	body := `{"uid": "nop.1", "inputs": [{"dtype": "DTYPE_FLOAT32", "shape": [1, 4], "data": "` + base64.StdEncoding.EncodeToString(x) + `"}]}`
	out := run("-d", body, addr, "moehost.v1.ExpertService/Forward")
	// nop returns its input.
	if !strings.Contains(out, base64.StdEncoding.EncodeToString(x)) || !strings.Contains(out, `"DTYPE_FLOAT32"`) {
		t.Errorf("grpcurl Forward did not return the input:\n%s", out)
	}
	// A bad call gets its code and a message that does not repeat it.
	cmd := exec.Command(gc, "-plaintext", "-d", `{"uid": "nope"}`, addr, "moehost.v1.ExpertService/Forward")
	bad, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(bad), "NotFound") || !strings.Contains(string(bad), "ListExperts") {
		t.Errorf("grpcurl Forward of an unknown uid: %v\n%s", err, bad)
	}
}
