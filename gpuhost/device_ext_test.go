package gpuhost_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

func TestApplyErrors(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		dev := d.dev
		f := func(shape ...int) *gpuhost.Tensor { return mustZeros(t, dev, abi.DTypeFloat32, shape...) }
		ids, err := dev.Zeros(abi.DTypeInt64, []int{2, 3})
		if err != nil {
			t.Fatal(err)
		}
		other, err := gpuhost.NewCPU(1).Zeros(abi.DTypeFloat32, []int{2, 3})
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name    string
			op      abi.Op
			args    []*gpuhost.Tensor
			attrs   []float64
			wantErr error
		}{
			{name: "unknown-op", op: 99, args: []*gpuhost.Tensor{f(2)}, wantErr: gpuhost.ErrUnknownOp},
			{name: "op-zero", op: 0, wantErr: gpuhost.ErrUnknownOp},
			{name: "matmul-one-arg", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(2, 2)}, wantErr: gpuhost.ErrArgument},
			{name: "matmul-three-attrs", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(2, 2), f(2, 2)}, attrs: []float64{0, 0, 0}, wantErr: gpuhost.ErrArgument},
			{name: "matmul-bad-flag", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(2, 2), f(2, 2)}, attrs: []float64{0.5}, wantErr: gpuhost.ErrArgument},
			{name: "matmul-nan-flag", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(2, 2), f(2, 2)}, attrs: []float64{0, math.NaN()}, wantErr: gpuhost.ErrArgument},
			{name: "matmul-k", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(2, 3), f(2, 3)}, wantErr: gpuhost.ErrShape},
			{name: "matmul-k-transposed", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(2, 3), f(2, 3)}, attrs: []float64{1, 1}, wantErr: gpuhost.ErrShape},
			{name: "matmul-3d", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(1, 2, 3), f(3, 2)}, wantErr: gpuhost.ErrShape},
			{name: "linear-four-args", op: abi.OpLinear, args: []*gpuhost.Tensor{f(2, 3), f(4, 3), f(4), f(4)}, wantErr: gpuhost.ErrArgument},
			{name: "linear-attr", op: abi.OpLinear, args: []*gpuhost.Tensor{f(2, 3), f(4, 3)}, attrs: []float64{1}, wantErr: gpuhost.ErrArgument},
			{name: "linear-features", op: abi.OpLinear, args: []*gpuhost.Tensor{f(2, 7), f(4, 8)}, wantErr: gpuhost.ErrShape},
			{name: "linear-bias", op: abi.OpLinear, args: []*gpuhost.Tensor{f(2, 3), f(4, 3), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "linear-w-1d", op: abi.OpLinear, args: []*gpuhost.Tensor{f(2, 3), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "linear-scalar-x", op: abi.OpLinear, args: []*gpuhost.Tensor{f(), f(1, 1)}, wantErr: gpuhost.ErrShape},
			{name: "add-no-suffix", op: abi.OpAdd, args: []*gpuhost.Tensor{f(2, 3, 4), f(2, 1, 4)}, wantErr: gpuhost.ErrShape},
			{name: "add-middle", op: abi.OpAdd, args: []*gpuhost.Tensor{f(2, 3, 4), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "add-nil", op: abi.OpAdd, args: []*gpuhost.Tensor{f(2), nil}, wantErr: gpuhost.ErrArgument},
			{name: "add-zero-value-tensor", op: abi.OpAdd, args: []*gpuhost.Tensor{f(2), {}}, wantErr: gpuhost.ErrArgument},
			{name: "add-int64", op: abi.OpAdd, args: []*gpuhost.Tensor{f(2, 3), ids}, wantErr: gpuhost.ErrArgument},
			{name: "add-other-device", op: abi.OpAdd, args: []*gpuhost.Tensor{f(2, 3), other}, wantErr: gpuhost.ErrArgument},
			{name: "gelu-two-args", op: abi.OpGeluTanh, args: []*gpuhost.Tensor{f(2), f(2)}, wantErr: gpuhost.ErrArgument},
			{name: "gelu-no-args", op: abi.OpGeluTanh, wantErr: gpuhost.ErrArgument},
			{name: "gelu-int64", op: abi.OpGeluTanh, args: []*gpuhost.Tensor{ids}, wantErr: gpuhost.ErrArgument},
			{name: "layer_norm-two-args", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3)}, wantErr: gpuhost.ErrArgument},
			{name: "layer_norm-w", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(2), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "layer_norm-b", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3), f(1, 3)}, wantErr: gpuhost.ErrShape},
			{name: "layer_norm-negative-eps", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3), f(3)}, attrs: []float64{-1}, wantErr: gpuhost.ErrArgument},
			{name: "layer_norm-nan-eps", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3), f(3)}, attrs: []float64{math.NaN()}, wantErr: gpuhost.ErrArgument},
			{name: "linear_gelu_tanh-attr", op: abi.OpLinearGeluTanh, args: []*gpuhost.Tensor{f(2, 3), f(4, 3)}, attrs: []float64{1}, wantErr: gpuhost.ErrArgument},
			{name: "linear_gelu_tanh-features", op: abi.OpLinearGeluTanh, args: []*gpuhost.Tensor{f(2, 7), f(4, 8)}, wantErr: gpuhost.ErrShape},
			{name: "linear_gelu_tanh-bias", op: abi.OpLinearGeluTanh, args: []*gpuhost.Tensor{f(2, 3), f(4, 3), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "add_layer_norm-three-args", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(2, 3), f(3)}, wantErr: gpuhost.ErrArgument},
			{name: "add_layer_norm-no-broadcast", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(2, 1), f(3), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "add_layer_norm-scalar-r", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(), f(3), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "add_layer_norm-scalars", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(), f(), f(1), f(1)}, wantErr: gpuhost.ErrShape},
			{name: "add_layer_norm-w", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3), f(2), f(3)}, wantErr: gpuhost.ErrShape},
			{name: "add_layer_norm-negative-eps", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3), f(3), f(3)}, attrs: []float64{-1}, wantErr: gpuhost.ErrArgument},
			{name: "layer_norm-two-attrs", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(2, 3), f(3), f(3)}, attrs: []float64{1e-5, 1}, wantErr: gpuhost.ErrArgument},
		}
		for _, tt := range tests {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				tape := gpuhost.NewTape()
				out, err := gpuhost.Apply(dev, tape, tt.op, tt.args, tt.attrs)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Apply error = %v, want %v", err, tt.wantErr)
				}
				if out != nil || tape.Len() != 0 {
					t.Errorf("failed Apply returned %v and recorded %d ops", out, tape.Len())
				}
			})
		}
	}
	if _, err := gpuhost.Apply(nil, nil, abi.OpGeluTanh, nil, nil); !errors.Is(err, gpuhost.ErrArgument) {
		t.Errorf("Apply on nil device: %v, want ErrArgument", err)
	}
}

func TestShapeMessage(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	x, _ := dev.Zeros(abi.DTypeFloat32, []int{2, 7})
	w, _ := dev.Zeros(abi.DTypeFloat32, []int{4, 8})
	_, err := gpuhost.Apply(dev, nil, abi.OpLinear, []*gpuhost.Tensor{x, w}, nil)
	const want = "shape mismatch: linear: x [2 7] has 7 features, W [4 8] expects 8"
	if err == nil || err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
}

func TestTensorStorage(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(0)
	if dev.Name() != "cpu" {
		t.Errorf("Name() = %q", dev.Name())
	}
	tests := []struct {
		name  string
		dt    abi.DType
		shape []int
	}{
		{name: "float32", dt: abi.DTypeFloat32, shape: []int{2, 3}},
		{name: "int32", dt: abi.DTypeInt32, shape: []int{5}},
		{name: "int64", dt: abi.DTypeInt64, shape: []int{3, 1, 2}},
		{name: "bool", dt: abi.DTypeBool, shape: []int{7}},
		{name: "scalar", dt: abi.DTypeFloat32, shape: []int{}},
	}
	for _, d := range devices() {
		dev := d.dev
		for _, tt := range tests {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				n := numel(tt.shape)
				data := make([]byte, n*tt.dt.Size())
				for i := range data {
					data[i] = byte(i*37 + 11)
				}
				if tt.dt == abi.DTypeFloat32 { // keep the floats ordinary numbers
					for i := range n {
						binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i)-2.5))
					}
				}
				x, err := dev.FromBytes(tt.dt, tt.shape, data)
				if err != nil {
					t.Fatal(err)
				}
				if x.DType() != tt.dt || !slices.Equal(x.Shape(), tt.shape) || x.Len() != n || x.ByteSize() != len(data) || x.Device() != dev {
					t.Errorf("tensor is %v %v len %d size %d", x.DType(), x.Shape(), x.Len(), x.ByteSize())
				}
				back := make([]byte, len(data))
				if err := dev.ReadBytes(x, back); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(back, data) {
					t.Errorf("ReadBytes = %v, want %v", back, data)
				}
				if err := dev.ReadBytes(x, back[1:]); !errors.Is(err, gpuhost.ErrShape) {
					t.Errorf("ReadBytes short: %v, want ErrShape", err)
				}
				if _, err := dev.FromBytes(tt.dt, tt.shape, append(data, 0)); !errors.Is(err, gpuhost.ErrShape) {
					t.Errorf("FromBytes long: %v, want ErrShape", err)
				}
				_, err = dev.Float32s(x)
				if tt.dt == abi.DTypeFloat32 && err != nil || tt.dt != abi.DTypeFloat32 && !errors.Is(err, gpuhost.ErrArgument) {
					t.Errorf("Float32s on %s: %v", tt.dt, err)
				}
				z, err := dev.Zeros(tt.dt, tt.shape)
				if err != nil {
					t.Fatal(err)
				}
				if err := dev.ReadBytes(z, back); err != nil || !bytes.Equal(back, make([]byte, len(data))) {
					t.Errorf("Zeros holds %v (%v)", back, err)
				}
			})
		}
	}
}

func TestShapeValidation(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			dev := d.dev
			tests := []struct {
				name    string
				dt      abi.DType
				shape   []int
				wantErr error
			}{
				{name: "zero-dim", dt: abi.DTypeFloat32, shape: []int{2, 0}, wantErr: gpuhost.ErrArgument},
				{name: "negative-dim", dt: abi.DTypeFloat32, shape: []int{-1, 3}, wantErr: gpuhost.ErrArgument},
				{name: "bad-dtype", dt: abi.DTypeInvalid, shape: []int{2}, wantErr: gpuhost.ErrArgument},
				{name: "unknown-dtype", dt: 77, shape: []int{2}, wantErr: gpuhost.ErrArgument},
				{name: "rank-9", dt: abi.DTypeBool, shape: []int{1, 1, 1, 1, 1, 1, 1, 1, 1}, wantErr: gpuhost.ErrArgument},
				{name: "overflow", dt: abi.DTypeFloat32, shape: []int{1 << 31, 1 << 31, 1 << 31}, wantErr: gpuhost.ErrArgument},
				{name: "bytes-overflow", dt: abi.DTypeInt64, shape: []int{1 << 31, 1 << 30}, wantErr: gpuhost.ErrArgument},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					if _, err := dev.Zeros(tt.dt, tt.shape); !errors.Is(err, tt.wantErr) {
						t.Errorf("Zeros: %v, want %v", err, tt.wantErr)
					}
					if _, err := dev.FromBytes(tt.dt, tt.shape, nil); !errors.Is(err, tt.wantErr) {
						t.Errorf("FromBytes: %v, want %v", err, tt.wantErr)
					}
				})
			}
			if _, err := dev.FromFloat32([]int{2, 2}, []float32{1, 2, 3}); !errors.Is(err, gpuhost.ErrShape) {
				t.Errorf("FromFloat32 with 3 values for [2 2]: %v, want ErrShape", err)
			}
			if _, err := dev.Float32s(nil); !errors.Is(err, gpuhost.ErrArgument) {
				t.Errorf("Float32s(nil): %v, want ErrArgument", err)
			}
			other, _ := gpuhost.NewCPU(1).Zeros(abi.DTypeFloat32, []int{1})
			if err := dev.ReadBytes(other, make([]byte, 4)); !errors.Is(err, gpuhost.ErrArgument) {
				t.Errorf("ReadBytes of another device's tensor: %v, want ErrArgument", err)
			}
		})
	}
}

func TestConcatSplit(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			dev := d.dev
			mk := func(dt abi.DType, shape ...int) *gpuhost.Tensor {
				n := numel(shape) * dt.Size()
				data := make([]byte, n)
				for i := range data {
					data[i] = byte(i + n) // distinct content per tensor size
				}
				x, err := dev.FromBytes(dt, shape, data)
				if err != nil {
					t.Fatal(err)
				}
				return x
			}
			raw := func(x *gpuhost.Tensor) []byte {
				b := make([]byte, x.ByteSize())
				if err := dev.ReadBytes(x, b); err != nil {
					t.Fatal(err)
				}
				return b
			}
			for _, dt := range []abi.DType{abi.DTypeFloat32, abi.DTypeInt32, abi.DTypeInt64, abi.DTypeBool} {
				t.Run(dt.String(), func(t *testing.T) {
					parts := []*gpuhost.Tensor{mk(dt, 1, 2, 3), mk(dt, 4, 2, 3), mk(dt, 2, 2, 3)}
					c, err := dev.Concat(parts)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(c.Shape(), []int{7, 2, 3}) || c.DType() != dt {
						t.Fatalf("Concat gave %v %v", c.DType(), c.Shape())
					}
					var want []byte
					for _, p := range parts {
						want = append(want, raw(p)...)
					}
					if !bytes.Equal(raw(c), want) {
						t.Errorf("Concat content differs")
					}
					back, err := dev.Split(c, []int{1, 4, 2})
					if err != nil {
						t.Fatal(err)
					}
					for i, p := range back {
						if !slices.Equal(p.Shape(), parts[i].Shape()) || !bytes.Equal(raw(p), raw(parts[i])) {
							t.Errorf("Split part %d = %v, want %v", i, p.Shape(), parts[i].Shape())
						}
					}
				})
			}
			x := mk(abi.DTypeFloat32, 3, 2)
			tests := []struct {
				name    string
				run     func() error
				wantErr error
			}{
				{name: "concat-empty", run: func() error { _, err := dev.Concat(nil); return err }, wantErr: gpuhost.ErrArgument},
				{name: "concat-dims", run: func() error { _, err := dev.Concat([]*gpuhost.Tensor{x, mk(abi.DTypeFloat32, 3, 3)}); return err }, wantErr: gpuhost.ErrShape},
				{name: "concat-dtype", run: func() error { _, err := dev.Concat([]*gpuhost.Tensor{x, mk(abi.DTypeInt32, 3, 2)}); return err }, wantErr: gpuhost.ErrArgument},
				{name: "concat-scalar", run: func() error { _, err := dev.Concat([]*gpuhost.Tensor{mk(abi.DTypeFloat32)}); return err }, wantErr: gpuhost.ErrShape},
				{name: "concat-nil", run: func() error { _, err := dev.Concat([]*gpuhost.Tensor{x, nil}); return err }, wantErr: gpuhost.ErrArgument},
				{name: "split-sum", run: func() error { _, err := dev.Split(x, []int{1, 1}); return err }, wantErr: gpuhost.ErrShape},
				{name: "split-over", run: func() error { _, err := dev.Split(x, []int{2, 2}); return err }, wantErr: gpuhost.ErrShape},
				{name: "split-zero", run: func() error { _, err := dev.Split(x, []int{3, 0}); return err }, wantErr: gpuhost.ErrArgument},
				{name: "split-scalar", run: func() error { _, err := dev.Split(mk(abi.DTypeFloat32), []int{1}); return err }, wantErr: gpuhost.ErrShape},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					if err := tt.run(); !errors.Is(err, tt.wantErr) {
						t.Errorf("error = %v, want %v", err, tt.wantErr)
					}
				})
			}
		})
	}
}

// mustZeros makes a zero tensor or fails the test.
func mustZeros(t testing.TB, dev gpuhost.Device, dt abi.DType, shape ...int) *gpuhost.Tensor {
	t.Helper()
	x, err := dev.Zeros(dt, shape)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
