package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	"github.com/spf13/cobra"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/cmd/moehost/internal/npy"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/client"
)

// maxInputBytes bounds what forward and backward read from one .npy file
// or from stdin: far over any request a server takes by default.
const maxInputBytes = 1 << 30

// callFlags are forward's and backward's flags beside --server and --token.
type callFlags struct {
	r       remote
	random  int
	inputs  []string
	outputs []string
	grads   []string // backward only
}

const callInputHelp = `Inputs come from one of:
  --random ROWS       random float32 values in [-1, 1), ROWS rows of each
                      input the expert declares (Info gives the shapes)
  --input FILE.npy    a float32, C-order .npy file; repeat it for each input
  stdin (JSON)        one input as nested arrays, [[1,2,3],[4,5,6]] (shape
                      [2,3]), or {"inputs": [T, ...]}, each T nested arrays
                      or {"shape": [2,3], "data": [1,2,3,4,5,6]}

The result goes to stdout as JSON, {"%s": [{"shape": [2,3], "data": [...]}]},
or with --output FILE.npy (once per result) to .npy files. A server's
refusal (an unknown expert, a shape that does not fit the schema, a bad
token) is printed as the server words it, and the exit status is 1.`

func forwardCmd(stdout io.Writer) *cobra.Command {
	var f callFlags
	cmd := &cobra.Command{
		Use:   "forward UID",
		Short: "Call an expert's Forward and print its outputs",
		Long: "Call Forward on the expert UID of the server at --server and print its\noutputs.\n\n" +
			fmt.Sprintf(callInputHelp, "outputs") + `

Example:
  moehost forward ffn.0 --random 2`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, e, err := f.expert(cmd, args[0])
			if err != nil {
				return err
			}
			defer c.Close()
			in, _, err := f.readInputs(cmd, e, false)
			if err != nil {
				return err
			}
			outs, err := e.Forward(cmd.Context(), in...)
			if err != nil {
				return err
			}
			return f.write(stdout, "outputs", outs)
		},
	}
	f.register(cmd, false)
	return cmd
}

func backwardCmd(stdout io.Writer) *cobra.Command {
	var f callFlags
	cmd := &cobra.Command{
		Use:   "backward UID",
		Short: "Call an expert's Backward (one training step) and print the input gradients",
		Long: "Call Backward on the expert UID of the server at --server, which trains it\none step, and print the gradients of its inputs.\n\n" +
			fmt.Sprintf(callInputHelp, "grad_inputs") + `

The output gradients come from --grad FILE.npy (once per output), else
from "grad_outputs" in the stdin JSON object (a list like "inputs"), else
are random in [-1, 1), shaped like the outputs the expert declares with
the inputs' rows. Under --tenants, Backward takes the expert owner's token
(the server's --admin-token for the operator's experts).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, e, err := f.expert(cmd, args[0])
			if err != nil {
				return err
			}
			defer c.Close()
			in, grads, err := f.readInputs(cmd, e, true)
			if err != nil {
				return err
			}
			gin, err := e.Backward(cmd.Context(), in, grads)
			if err != nil {
				return err
			}
			return f.write(stdout, "grad_inputs", gin)
		},
	}
	f.register(cmd, true)
	return cmd
}

func (f *callFlags) register(cmd *cobra.Command, backward bool) {
	f.r.register(cmd, false)
	fl := cmd.Flags()
	fl.IntVar(&f.random, "random", 0, "send ROWS rows of random inputs shaped by the expert's schema")
	fl.StringArrayVar(&f.inputs, "input", nil, "read an input from a float32 .npy file (repeat for each input)")
	fl.StringArrayVar(&f.outputs, "output", nil, "write a result to a .npy file instead of JSON to stdout (repeat for each result)")
	if backward {
		fl.StringArrayVar(&f.grads, "grad", nil, "read an output gradient from a float32 .npy file (repeat for each output; default random)")
	}
	cmd.MarkFlagsMutuallyExclusive("random", "input")
}

// expert resolves the flags into a client and the expert uid.
func (f *callFlags) expert(cmd *cobra.Command, uid string) (*client.Client, *client.RemoteExpert, error) {
	if err := f.r.resolve(cmd); err != nil {
		return nil, nil, err
	}
	if cmd.Flags().Changed("random") && f.random < 1 {
		return nil, nil, fmt.Errorf("--random %d: want at least 1 row", f.random)
	}
	c := client.New(f.r.url(), client.WithToken(f.r.token), client.WithTLSConfig(f.r.tls))
	return c, c.Expert(uid), nil
}

// readInputs reads the inputs, and with grads the output gradients, from
// the flags or stdin.
func (f *callFlags) readInputs(cmd *cobra.Command, e *client.RemoteExpert, grads bool) (in, gout []client.Tensor, err error) {
	var info *moehostv1.ExpertInfo
	schema := func() (*moehostv1.ExpertInfo, error) {
		if info == nil {
			var err error
			info, err = e.Info(cmd.Context())
			return info, err
		}
		return info, nil
	}
	switch {
	case f.random > 0:
		i, err := schema()
		if err != nil {
			return nil, nil, err
		}
		if in, err = randomTensors(i.GetInputs(), "input", int64(f.random)); err != nil {
			return nil, nil, err
		}
	case len(f.inputs) > 0:
		if in, err = readNpys(f.inputs); err != nil {
			return nil, nil, err
		}
	default:
		if in, gout, err = readJSON(cmd.InOrStdin()); err != nil {
			return nil, nil, err
		}
	}
	if !grads {
		return in, nil, nil
	}
	switch {
	case len(f.grads) > 0:
		gout, err = readNpys(f.grads)
		return in, gout, err
	case gout != nil:
		return in, gout, nil
	}
	rows := int64(1)
	if len(in) > 0 && len(in[0].Shape) > 0 {
		rows = in[0].Shape[0]
	}
	i, err := schema()
	if err != nil {
		return nil, nil, err
	}
	gout, err = randomTensors(i.GetOutputs(), "output", rows)
	return in, gout, err
}

// randomTensors makes a tensor of random values in [-1, 1) for each
// schema, with rows in place of the batch dimension (-1).
func randomTensors(schemas []*moehostv1.TensorSchema, what string, rows int64) ([]client.Tensor, error) {
	out := make([]client.Tensor, len(schemas))
	for i, s := range schemas {
		if abi.DType(s.GetDtype()) != abi.DTypeFloat32 {
			return nil, fmt.Errorf("%s %d (%s) is %v: random values are float32 only; pass it as a file", what, i, s.GetName(), abi.DType(s.GetDtype()))
		}
		shape := make([]int64, len(s.GetShape()))
		n := int64(1)
		for j, d := range s.GetShape() {
			if d < 0 {
				d = rows
			}
			shape[j] = d
			n *= d
		}
		if n > maxInputBytes/4 {
			return nil, fmt.Errorf("%s %d (%s): %v is too many values", what, i, s.GetName(), shape)
		}
		v := make([]float32, n)
		for k := range v {
			v[k] = rand.Float32()*2 - 1
		}
		out[i] = client.Float32(shape, v)
	}
	return out, nil
}

func readNpys(paths []string) ([]client.Tensor, error) {
	out := make([]client.Tensor, len(paths))
	for i, p := range paths {
		fh, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		a, err := npy.Read(fh, maxInputBytes)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out[i] = client.Float32(a.Shape, a.Data)
	}
	return out, nil
}

// jsonTensor is a tensor as forward prints it.
type jsonTensor struct {
	Shape []int64   `json:"shape"`
	Data  []float32 `json:"data"`
}

// readJSON reads one input as nested arrays, or an object with "inputs"
// and optionally "grad_outputs".
func readJSON(r io.Reader) (in, gout []client.Tensor, err error) {
	b, err := io.ReadAll(io.LimitReader(r, maxInputBytes+1))
	if err != nil {
		return nil, nil, err
	}
	if len(b) > maxInputBytes {
		return nil, nil, fmt.Errorf("stdin: more than %d bytes", maxInputBytes)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, nil, errors.New("no input: give --random ROWS, --input FILE.npy, or JSON on stdin")
	}
	if b[0] != '{' {
		t, err := jsonToTensor(b)
		if err != nil {
			return nil, nil, fmt.Errorf("stdin: %w", err)
		}
		return []client.Tensor{t}, nil, nil
	}
	var obj struct {
		Inputs      []json.RawMessage `json:"inputs"`
		GradOutputs []json.RawMessage `json:"grad_outputs"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		return nil, nil, fmt.Errorf("stdin: %w", err)
	}
	if obj.Inputs == nil {
		return nil, nil, errors.New(`stdin: the object has no "inputs"`)
	}
	list := func(what string, raws []json.RawMessage) ([]client.Tensor, error) {
		out := make([]client.Tensor, len(raws))
		for i, raw := range raws {
			t, err := jsonToTensor(raw)
			if err != nil {
				return nil, fmt.Errorf("stdin: %s %d: %w", what, i, err)
			}
			out[i] = t
		}
		return out, nil
	}
	if in, err = list("inputs", obj.Inputs); err != nil {
		return nil, nil, err
	}
	if obj.GradOutputs != nil {
		if gout, err = list("grad_outputs", obj.GradOutputs); err != nil {
			return nil, nil, err
		}
	}
	return in, gout, nil
}

// jsonToTensor reads nested arrays of numbers, or {"shape", "data"}.
func jsonToTensor(raw json.RawMessage) (client.Tensor, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '{' {
		var t jsonTensor
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			return client.Tensor{}, err
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return client.Tensor{}, fmt.Errorf("shape %v has a negative dimension", t.Shape)
			}
			n *= d
		}
		if n != int64(len(t.Data)) {
			return client.Tensor{}, fmt.Errorf("%d values for shape %v", len(t.Data), t.Shape)
		}
		return client.Float32(t.Shape, t.Data), nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return client.Tensor{}, err
	}
	var shape []int64
	for x := v; ; {
		a, ok := x.([]any)
		if !ok {
			break
		}
		shape = append(shape, int64(len(a)))
		if len(a) == 0 {
			break
		}
		x = a[0]
	}
	var data []float32
	var walk func(x any, depth int, path string) error
	walk = func(x any, depth int, path string) error {
		if depth == len(shape) {
			f, ok := x.(float64)
			if !ok {
				return fmt.Errorf("%s: want a number at depth %d, as the first element has", path, depth)
			}
			data = append(data, float32(f))
			return nil
		}
		a, ok := x.([]any)
		if !ok || int64(len(a)) != shape[depth] {
			return fmt.Errorf("%s: not rectangular: want %d elements at depth %d (shape %v)", path, shape[depth], depth, shape)
		}
		for i, y := range a {
			if err := walk(y, depth+1, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(v, 0, "value"); err != nil {
		return client.Tensor{}, err
	}
	if shape == nil {
		shape = []int64{}
	}
	return client.Float32(shape, data), nil
}

// write prints the results as JSON under key, or writes them to --output
// files.
func (f *callFlags) write(stdout io.Writer, key string, ts []client.Tensor) error {
	if len(f.outputs) > 0 && len(f.outputs) != len(ts) {
		return fmt.Errorf("the expert returned %d results and %d --output files were given", len(ts), len(f.outputs))
	}
	js := make([]jsonTensor, len(ts))
	for i, t := range ts {
		v, err := t.Float32s()
		if err != nil {
			return fmt.Errorf("result %d: %w", i, err)
		}
		if len(f.outputs) > 0 {
			if err := writeNpy(f.outputs[i], npy.Array{Shape: t.Shape, Data: v}); err != nil {
				return err
			}
			continue
		}
		js[i] = jsonTensor{Shape: t.Shape, Data: v}
	}
	if len(f.outputs) > 0 {
		return nil
	}
	b, err := json.Marshal(map[string][]jsonTensor{key: js})
	if err != nil {
		return fmt.Errorf("%w (JSON has no NaN or Inf; --output FILE.npy keeps them)", err)
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

func writeNpy(path string, a npy.Array) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := npy.Write(fh, a); err != nil {
		fh.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return fh.Close()
}
