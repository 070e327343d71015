//go:build !cuda && !cudaemu

package host_test

import (
	"testing"

	"github.com/moehost/moehost/host"
)

// TestDeviceWithoutCUDA checks that a binary built without CUDA refuses a
// CUDA device in New with the message that says how to get one, and
// still takes "cpu".
func TestDeviceWithoutCUDA(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"cuda", "cuda:0", "cuda:0,1"} {
		_, err := host.New(host.WithDevice(spec))
		if err == nil || err.Error() != "built without CUDA support; rebuild with make build-cuda" {
			t.Errorf("New(WithDevice(%q)) = %v; want the built-without-CUDA error", spec, err)
		}
	}
	if _, err := host.New(host.WithDevice("cpu")); err != nil {
		t.Errorf("New(WithDevice(cpu)) = %v", err)
	}
}
