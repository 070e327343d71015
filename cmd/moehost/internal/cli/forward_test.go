package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/cmd/moehost/internal/npy"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// TestForwardBackward calls a real server's ffn expert with moehost
// forward and backward, from every kind of input, and checks the results
// against the Go client's and the server's refusals word for word.
func TestForwardBackward(t *testing.T) {
	skipUnderRace(t)
	const width = 4
	ctx := context.Background()
	// With tenants, a token no tenant holds is refused.
	tenants := filepath.Join(t.TempDir(), "tenants.json")
	if code, _, errOut := runT(t, "tenant", "add", "alice", "--prefix", "alice", "--tenants", tenants); code != 0 {
		t.Fatalf("tenant add: exit %d: %s", code, errOut)
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()), host.WithoutDHT(),
		host.WithCheckpoints(host.CheckpointConfig{Disabled: true}), host.WithAdminToken("admin-secret"), host.WithTenants(tenants),
		host.WithExperts(host.ExpertConfig{UID: "ffn.0", Module: host.ModuleBytes(wasmexperts.FFNC), Config: map[string]int64{"hidden_dim": width}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(ctx) })
	url := "http://" + srv.Addr()
	t.Setenv(tokenEnv, "")

	run := func(stdin string, args ...string) (string, string, int) {
		var stdout, stderr bytes.Buffer
		code := mainWith(append(args, "--server", url), strings.NewReader(stdin), &stdout, &stderr)
		return stdout.String(), stderr.String(), code
	}
	type result struct {
		Outputs    []jsonTensor `json:"outputs"`
		GradInputs []jsonTensor `json:"grad_inputs"`
	}
	parse := func(name, stdout string) result {
		t.Helper()
		var r result
		dec := json.NewDecoder(strings.NewReader(stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("%s: %v in %q", name, err, stdout)
		}
		return r
	}
	c := client.New(url)
	defer c.Close()
	want := func(x []float32, rows int64) []float32 {
		t.Helper()
		outs, err := c.Expert("ffn.0").Forward(ctx, client.Float32([]int64{rows, width}, x))
		if err != nil {
			t.Fatal(err)
		}
		y, err := outs[0].Float32s()
		if err != nil {
			t.Fatal(err)
		}
		return y
	}
	x := []float32{1, -2, 0.5, 3, 0, -1, 2, 0.25}

	t.Run("random", func(t *testing.T) {
		stdout, stderr, code := run("", "forward", "ffn.0", "--random", "3")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		r := parse("forward --random 3", stdout)
		if len(r.Outputs) != 1 || !slices.Equal(r.Outputs[0].Shape, []int64{3, width}) || len(r.Outputs[0].Data) != 3*width {
			t.Errorf("forward --random 3: %q, want one output of shape [3 %d]", stdout, width)
		}
	})

	t.Run("npy in and out", func(t *testing.T) {
		dir := t.TempDir()
		in, out := filepath.Join(dir, "x.npy"), filepath.Join(dir, "y.npy")
		if err := writeNpy(in, npy.Array{Shape: []int64{2, width}, Data: x}); err != nil {
			t.Fatal(err)
		}
		if _, stderr, code := run("", "forward", "ffn.0", "--input", in, "--output", out); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		fh, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		got, err := npy.Read(fh, 0)
		if err != nil {
			t.Fatal(err)
		}
		if w := want(x, 2); !slices.Equal(got.Shape, []int64{2, width}) || !slices.Equal(got.Data, w) {
			t.Errorf("forward --input: %v %v, want the Go client's [2 %d] %v", got.Shape, got.Data, width, w)
		}
	})

	t.Run("json on stdin", func(t *testing.T) {
		for _, tc := range []struct{ name, stdin string }{
			{name: "nested arrays", stdin: "[[1, -2, 0.5, 3], [0, -1, 2, 0.25]]\n"},
			{name: "object", stdin: `{"inputs": [{"shape": [2, 4], "data": [1, -2, 0.5, 3, 0, -1, 2, 0.25]}]}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				stdout, stderr, code := run(tc.stdin, "forward", "ffn.0")
				if code != 0 {
					t.Fatalf("exit %d: %s", code, stderr)
				}
				r := parse("forward", stdout)
				if w := want(x, 2); len(r.Outputs) != 1 || !slices.Equal(r.Outputs[0].Shape, []int64{2, width}) || !slices.Equal(r.Outputs[0].Data, w) {
					t.Errorf("forward: %q, want [2 %d] %v", stdout, width, w)
				}
			})
		}
		if _, stderr, code := run("[[1, 2], [3]]", "forward", "ffn.0"); code != 1 || !strings.Contains(stderr, "value[1]: not rectangular") {
			t.Errorf("ragged arrays: exit %d, %q", code, stderr)
		}
	})

	t.Run("backward", func(t *testing.T) {
		// ffn-c's input gradient is linear in the output gradient: zero
		// ones give zeros, and that is checked on every element.
		zeros := `[0,0,0,0]`
		stdin := `{"inputs": [[[1, -2, 0.5, 3], [0, -1, 2, 0.25]]], "grad_outputs": [[` + zeros + `,` + zeros + `]]}`
		stdout, stderr, code := run(stdin, "backward", "ffn.0", "--token", "admin-secret")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		r := parse("backward", stdout)
		if len(r.GradInputs) != 1 || !slices.Equal(r.GradInputs[0].Shape, []int64{2, width}) || !slices.Equal(r.GradInputs[0].Data, make([]float32, 2*width)) {
			t.Errorf("backward with zero grads: %q, want zeros of shape [2 %d]", stdout, width)
		}
		dir := t.TempDir()
		xf, gf := filepath.Join(dir, "x.npy"), filepath.Join(dir, "g.npy")
		if err := writeNpy(xf, npy.Array{Shape: []int64{2, width}, Data: x}); err != nil {
			t.Fatal(err)
		}
		if err := writeNpy(gf, npy.Array{Shape: []int64{2, width}, Data: make([]float32, 2*width)}); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, code = run("", "backward", "ffn.0", "--input", xf, "--grad", gf, "--token", "admin-secret")
		if r := parse("backward --grad", stdout); code != 0 || len(r.GradInputs) != 1 || !slices.Equal(r.GradInputs[0].Shape, []int64{2, width}) || !slices.Equal(r.GradInputs[0].Data, make([]float32, 2*width)) {
			t.Errorf("backward --input --grad zeros: exit %d, %q (%s), want zeros of shape [2 %d]", code, stdout, stderr, width)
		}
		stdout, stderr, code = run("", "backward", "ffn.0", "--random", "3", "--token", "admin-secret")
		if code != 0 {
			t.Fatalf("backward --random 3: exit %d: %s", code, stderr)
		}
		r = parse("backward --random 3", stdout)
		if len(r.GradInputs) != 1 || !slices.Equal(r.GradInputs[0].Shape, []int64{3, width}) || len(r.GradInputs[0].Data) != 3*width {
			t.Fatalf("backward --random 3: %q, want [3 %d]", stdout, width)
		}
		nonzero := false
		for _, v := range r.GradInputs[0].Data {
			nonzero = nonzero || (v != 0 && !math.IsNaN(float64(v)))
		}
		if !nonzero {
			t.Errorf("backward --random 3: all-zero gradients %v from random output gradients", r.GradInputs[0].Data)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name, stdin string
			args        []string
			want        string
		}{
			{name: "wrong width", stdin: "[[1, 2, 3]]", args: []string{"forward", "ffn.0"}, want: "invalid_argument: forward \"ffn.0\": tensors do not fit the expert: input 0: shape [1 3], want x:float32[-1,4]"},
			{name: "unknown expert", args: []string{"forward", "nope.0", "--random", "1"}, want: `not_found: no expert "nope.0" on this server`},
			{name: "bad token", args: []string{"forward", "ffn.0", "--random", "1", "--token", "wrong"}, want: "unauthenticated: the bearer token is not valid on this server"},
			{name: "backward without a token", args: []string{"backward", "ffn.0", "--random", "1"}, want: "--admin-token"},
			{name: "no input", args: []string{"forward", "ffn.0"}, want: "no input: give --random ROWS"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				stdout, stderr, code := run(tc.stdin, tc.args...)
				if code != 1 || stdout != "" || !strings.Contains(stderr, tc.want) {
					t.Errorf("exit %d, stdout %q, stderr %q; want 1 and %q", code, stdout, stderr, tc.want)
				}
			})
		}
	})
}
