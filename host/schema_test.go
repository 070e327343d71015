package host

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/hivemind"
)

// TestOneSchemaCheck sends the same misfit requests to small.0 by every
// path a request takes (Connect, the in-process Server.Forward and
// Backward, and the hivemind room's Experts) and checks that each refuses
// it with the one check's message and InvalidArgument (hivemind's
// ErrInvalid), before any batch runs.
func TestOneSchemaCheck(t *testing.T) {
	ctx := context.Background()
	const h = smallHidden
	type tensorSpec struct {
		dt    abi.DType
		shape []int64
	}
	x := func(shape ...int64) tensorSpec { return tensorSpec{abi.DTypeFloat32, shape} }
	good := []tensorSpec{x(2, h)}
	tests := []struct {
		name          string
		backward      bool
		inputs, grads []tensorSpec
		msg           string // the one check's message, whole
	}{
		{"no inputs", false, nil, nil, "got 0 inputs, want 1: x:float32[-1,8]"},
		{"two inputs", false, []tensorSpec{x(2, h), x(2, h)}, nil, "got 2 inputs, want 1: x:float32[-1,8]"},
		{"dtype", false, []tensorSpec{{abi.DTypeInt32, []int64{2, h}}}, nil, "input 0: dtype int32, want x:float32[-1,8]"},
		{"rank", false, []tensorSpec{x(2 * h)}, nil, "input 0: rank 1 (shape [16]), want x:float32[-1,8]"},
		{"width", false, []tensorSpec{x(2, h+1)}, nil, "input 0: shape [2 9], want x:float32[-1,8]"},
		{"no grads", true, good, nil, "got 0 grad_outputs, want 1: y:float32[-1,8]"},
		{"grad batch", true, good, []tensorSpec{x(3, h)}, "grad_output 0: batch size 3, want y:float32[-1,8] with batch 2"},
		{"grad width", true, good, []tensorSpec{x(2, h+1)}, "grad_output 0: shape [2 9], want y:float32[-1,8] with batch 2"},
	}
	wireOf := func(ts []tensorSpec) []*moehostv1.Tensor {
		out := make([]*moehostv1.Tensor, len(ts))
		for i, s := range ts {
			n := int64(1)
			for _, d := range s.shape {
				n *= d
			}
			out[i] = &moehostv1.Tensor{Dtype: moehostv1.DType(s.dt), Shape: s.shape, Data: make([]byte, 4*n)}
		}
		return out
	}
	hivemindOf := func(ts []tensorSpec) []hivemind.Tensor {
		out := make([]hivemind.Tensor, len(ts))
		for i, pb := range wireOf(ts) {
			shape := make([]int, len(pb.Shape))
			for j, d := range pb.Shape {
				shape[j] = int(d)
			}
			out[i] = hivemind.Tensor{DType: abi.DType(pb.Dtype), Shape: shape, Data: pb.Data}
		}
		return out
	}
	dev := testServer.Device()
	deviceOf := func(t *testing.T, ts []tensorSpec) []*gpuhost.Tensor {
		out := make([]*gpuhost.Tensor, len(ts))
		for i, pb := range wireOf(ts) {
			shape := make([]int, len(pb.Shape))
			for j, d := range pb.Shape {
				shape[j] = int(d)
			}
			d, err := dev.Zeros(abi.DType(pb.Dtype), shape)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = d
		}
		t.Cleanup(func() { dev.Release(out...) })
		return out
	}
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+testServer.Addr())
	hm := hivemindExperts{testServer.experts}
	before := testServer.expert("small.0").Info()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errs [3]error
			if tt.backward {
				_, errs[0] = c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{Uid: "small.0", Inputs: wireOf(tt.inputs), GradOutputs: wireOf(tt.grads)}))
				_, errs[1] = testServer.Backward(ctx, "small.0", deviceOf(t, tt.inputs), deviceOf(t, tt.grads))
				_, errs[2] = hm.HivemindBackward(ctx, "small.0", hivemindOf(tt.inputs), hivemindOf(tt.grads))
			} else {
				_, errs[0] = c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: wireOf(tt.inputs)}))
				_, errs[1] = testServer.Forward(ctx, "small.0", deviceOf(t, tt.inputs))
				_, errs[2] = hm.HivemindForward(ctx, "small.0", hivemindOf(tt.inputs))
			}
			for i, path := range []string{"Connect", "in-process", "hivemind"} {
				err := errs[i]
				var code connect.Code
				switch i {
				case 0:
					code = connect.CodeOf(err)
				case 1:
					code = errorCodes.Of(err)
				case 2:
					if errors.Is(err, hivemind.ErrInvalid) {
						code = connect.CodeInvalidArgument
					}
				}
				if code != connect.CodeInvalidArgument || !strings.HasSuffix(messageOf(err), tt.msg) {
					t.Errorf("%s: %v (%v), want InvalidArgument ending in %q", path, err, code, tt.msg)
				}
			}
		})
	}
	// Refused before any batch ran.
	after := testServer.expert("small.0").Info()
	if b, a := before.GetForwardPool().GetBatches()+before.GetBackwardPool().GetBatches(), after.GetForwardPool().GetBatches()+after.GetBackwardPool().GetBatches(); a != b {
		t.Errorf("%d batches ran for refused requests", a-b)
	}
}
