//go:build cuda || cudaemu

package gpuhost

import (
	"errors"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
)

// TestCUDAOpsStopBetweenLaunches gives each row op of several launches
// an output whose stop channel is closed: it must return errStopped after
// its first step and leave the outputs of its later steps as they were
// (filled with 7s here); without the stop the same call overwrites them.
func TestCUDAOpsStopBetweenLaunches(t *testing.T) {
	dev, err := NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	d := dev.(*cudaDevice)
	closed := make(chan struct{})
	close(closed)
	// fill makes an input of values c, c+¼, c+½, c, …; sevens an output.
	fill := func(c float32, shape ...int) *Tensor {
		n := 1
		for _, s := range shape {
			n *= s
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = c + float32(i%3)/4
		}
		x, err := d.FromFloat32(shape, v)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	sevens := func(shape ...int) *Tensor {
		x := fill(7, shape...)
		if err := d.unary(unaryScale, 0, x, x); err != nil {
			t.Fatal(err)
		}
		if err := d.unary(unaryAddScalar, 7, x, x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	ids := func(dt abi.DType, v ...byte) *Tensor {
		b := make([]byte, len(v)*dt.Size())
		for i, e := range v {
			b[i*dt.Size()] = e
		}
		x, err := d.FromBytes(dt, []int{len(v)}, b)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	a := attnDims{b: 1, h: 2, tq: 3, tk: 4, d: 5, dv: 2, scale: 0.5}
	q, k, v := fill(0.1, 1, 2, 3, 5), fill(-0.3, 1, 2, 4, 5), fill(0.5, 1, 2, 4, 2)
	x, w := fill(0.5, 4, 6), fill(1, 6)
	mean, rstd := fill(0.2, 4), fill(1.5, 4)
	tests := []struct {
		name string
		// run calls the kernel; stop is the channel of the output it
		// checks, and kept the outputs that must stay 7s when stopped.
		run func(stop <-chan struct{}) (kept []*Tensor, err error)
	}{
		{name: "embedding", run: func(stop <-chan struct{}) ([]*Tensor, error) {
			y := sevens(3, 6)
			y.stop = stop
			return []*Tensor{y}, d.embedding(y, ids(abi.DTypeInt32, 0, 3, 1), x)
		}},
		{name: "cross_entropy", run: func(stop <-chan struct{}) ([]*Tensor, error) {
			loss, lse := sevens(4), sevens(4)
			loss.stop = stop
			_, err := d.crossEntropy(loss, lse, x, ids(abi.DTypeInt64, 0, 5, 2, 1), -100)
			return []*Tensor{loss, lse}, err
		}},
		{name: "attention", run: func(stop <-chan struct{}) ([]*Tensor, error) {
			out, probs := sevens(1, 2, 3, 2), sevens(1, 2, 3, 4)
			out.stop = stop
			return []*Tensor{out}, d.attention(out, probs, q, k, v, nil, a)
		}},
		{name: "attention_backward", run: func(stop <-chan struct{}) ([]*Tensor, error) {
			gq, gk := sevens(1, 2, 3, 5), sevens(1, 2, 4, 5)
			gq.stop = stop
			return []*Tensor{gq, gk}, d.attentionBackward(gq, gk, nil, q, k, v, fill(0.25, 1, 2, 3, 4), fill(-1, 1, 2, 3, 2), a)
		}},
		{name: "layer_norm_backward", run: func(stop <-chan struct{}) ([]*Tensor, error) {
			gx, gw, gb := sevens(4, 6), sevens(6), sevens(6)
			gx.stop = stop
			return []*Tensor{gw, gb}, d.layerNormBackward(gx, gw, gb, x, w, mean, rstd, fill(-0.5, 4, 6))
		}},
		{name: "rms_norm_backward", run: func(stop <-chan struct{}) ([]*Tensor, error) {
			gx, gw := sevens(4, 6), sevens(6)
			gx.stop = stop
			return []*Tensor{gw}, d.rmsNormBackward(gx, gw, x, w, rstd, fill(-0.5, 4, 6))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, stop := range []<-chan struct{}{closed, nil} {
				kept, err := tt.run(stop)
				if stop != nil && !errors.Is(err, errStopped) {
					t.Fatalf("stopped: %v, want errStopped", err)
				}
				if stop == nil && err != nil {
					t.Fatalf("not stopped: %v", err)
				}
				for i, o := range kept {
					f, err := d.Float32s(o)
					if err != nil {
						t.Fatal(err)
					}
					untouched := !slices.ContainsFunc(f, func(v float32) bool { return v != 7 })
					if untouched != (stop != nil) {
						t.Errorf("stop %v: output %d untouched = %v", stop != nil, i, untouched)
					}
				}
			}
		})
	}
}
